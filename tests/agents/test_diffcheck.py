"""The check a sub-agent's patch gets after its run, on a real git worktree (no agent needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from specpilot.agents.claude import diffcheck
from specpilot.agents.protocol import AgentError

PROTECTED = ["refspec/serve.py"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def wt(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "refspec").mkdir(parents=True)
    (repo / "refspec.toml").write_text("[decode]\nblock_size = 8\n")
    (repo / "refspec" / "serve.py").write_text("print('serve')\n")
    git(repo, "init", "-q", "-b", "system")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "stock")
    git(repo, "worktree", "add", "-q", "-b", "cand/x", str(tmp_path / "wt"))
    return tmp_path / "wt"


def test_collect_stages_new_files_and_drops_scratch(wt):
    (wt / "refspec.toml").write_text("[decode]\nblock_size = 6\n")
    (wt / "refspec" / "tree.py").write_text("X = 1\n")
    (wt / ".scratch").mkdir()
    (wt / ".scratch" / "notes").write_text("tmp")
    diff = diffcheck.collect(wt)
    assert "+block_size = 6" in diff and "refspec/tree.py" in diff and ".scratch" not in diff
    diffcheck.check(wt, diff, PROTECTED, 10_000)  # passes


def test_check_rejects_empty_protected_oversized_and_escaping_links(wt, tmp_path):
    record = {"transcript": "t.jsonl", "cost_usd": 0.1}
    with pytest.raises(AgentError, match="changed nothing") as err:
        diffcheck.check(wt, diffcheck.collect(wt), PROTECTED, 10_000, record)
    assert err.value.record is record  # the round keeps the run's transcript and cost with the failure

    (wt / "refspec" / "serve.py").write_text("print('faster')\n")
    with pytest.raises(AgentError, match="touches protected paths: refspec/serve.py"):
        diffcheck.check(wt, diffcheck.collect(wt), PROTECTED, 10_000)
    git(wt, "reset", "-q", "--hard")

    (wt / "big.bin").write_text("x" * 5000)
    diff = diffcheck.collect(wt)
    with pytest.raises(AgentError, match=r"the patch is \d+ bytes, over the limit of 1000 bytes"):
        diffcheck.check(wt, diff, PROTECTED, 1000)
    git(wt, "reset", "-q", "--hard")  # staged, so the reset removes the new file too

    (wt / "weights").symlink_to(tmp_path)
    with pytest.raises(AgentError, match="symbolic link weights -> .* leads out of the tree"):
        diffcheck.check(wt, diffcheck.collect(wt), PROTECTED, 10_000)
