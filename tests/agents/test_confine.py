"""The write and read checks of the PreToolUse hook (`confine.check_tool`) on real folders and
symbolic links.

These are the hook's rules alone; the sub-agent test shows them (and the Bash sandbox behind them)
inside a real run of the Claude Code CLI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specpilot.agents.claude.confine import bash_writes, check_tool
from specpilot.deployments import Home


@pytest.fixture
def tree(tmp_path: Path):
    wt, out = tmp_path / "wt", tmp_path / "outside"
    (wt / "refspec").mkdir(parents=True)
    (wt / ".git").write_text("gitdir: /somewhere\n")
    out.mkdir()
    (wt / "escape").symlink_to(out)
    return wt, out


def bash(cmd: str, wt: Path) -> str | None:
    return check_tool("Bash", {"command": cmd}, wt, wt, None, {"HOME": "/home/agent", "PWD": str(wt)})


def test_file_tools_write_only_inside(tree):
    wt, out = tree
    assert check_tool("Write", {"file_path": "refspec/x.py"}, wt, wt, None) is None
    assert check_tool("Edit", {"file_path": str(wt / "refspec.toml")}, wt, wt, None) is None
    for path in (str(out / "x"), "../outside/x", "escape/x", str(wt / ".git"), "~/x", "$HOME/x"):
        assert "outside your worktree" in check_tool("Write", {"file_path": path}, wt, wt, None), path
    assert "without a file_path" in check_tool("Write", {}, wt, wt, None)


def test_the_controllers_records_are_not_read(tmp_path: Path):
    """A home as a round leaves it: the agent's worktree inside, the database and raw runs (each
    draw's secret tags and the answers given under them) beside it; a link to a raw run from the
    worktree is the raw run."""
    home = Home(tmp_path / "home")
    wt = home.workspaces / "dep" / "r1-d0"
    wt.mkdir(parents=True)
    (wt / "serve.py").write_text("")
    home.runs.mkdir()
    (home.runs / "run.jsonl").write_text("{}\n")
    (home.root / "specpilot.db").write_text("")
    (wt / "peek").symlink_to(home.runs / "run.jsonl")
    hidden = [tmp_path / "secret", *home.records]
    for tool, key in (("Read", "file_path"), ("Grep", "path"), ("Glob", "path")):
        for path in (str(home.root / "specpilot.db"), str(home.runs / "run.jsonl"), str(home.runs),
                     "peek", str(home.root), "../../.."):  # fmt: skip
            reason = check_tool(tool, {key: path}, wt, wt, hidden)
            assert reason is not None and "agents may not read" in reason, (tool, path)
        assert check_tool(tool, {key: "serve.py" if tool == "Read" else str(wt)}, wt, wt, hidden) is None
    assert check_tool("Grep", {}, wt, wt, hidden) is None  # its own worktree, the default
    assert check_tool("Read", {"file_path": str(home.deployments / "dep.toml")}, wt, wt, hidden) is None


def test_a_cluster_nodes_agent_reads_no_records_of_the_cluster(tmp_path: Path):
    """On a Ray cluster each node keeps a home of its own under the head's (`nodes/<id>`): a node's
    agent reads its own worktree, but neither its own records, nor another node's, nor the head's."""
    head = Home(tmp_path / "home")
    nodes = [Home(head.root / "nodes" / n) for n in ("a1", "b2")]
    for h in (head, *nodes):
        h.runs.mkdir(parents=True)
        (h.runs / "run.jsonl").write_text("{}\n")
        (h.root / "specpilot.db").write_text("")
    wt = nodes[1].workspaces / "dep" / "r1-d0"
    wt.mkdir(parents=True)
    (wt / "serve.py").write_text("")
    for home in (head, *nodes):
        hidden = nodes[1].records
        for path in (home.root / "specpilot.db", home.runs / "run.jsonl"):
            assert "agents may not read" in check_tool("Read", {"file_path": str(path)}, wt, wt, hidden), path
    assert check_tool("Read", {"file_path": "serve.py"}, wt, wt, nodes[1].records) is None
    assert sorted(head.records) == sorted(nodes[0].records)  # one set, wherever it is asked


@pytest.mark.parametrize(
    "cmd",
    [
        "echo x > ../outside/a",
        "cd .. && touch outside/a",
        "cat refspec.toml | tee -a /tmp/x",
        "cp refspec.toml escape/",
        "mv refspec.toml escape",  # the destination is written through the link
        "rm -r escape/",  # a trailing slash removes what the link points to
        "sed -i s/a/b/ /etc/hosts",
        "bash -c 'echo x >> /root/.bashrc'",
        "git add -A",
        "git -C .. commit -m x",
        "dd if=/dev/zero of=/tmp/z count=1",
    ],
)
def test_bash_writes_outside_are_denied(tree, cmd):
    wt, _ = tree
    assert bash(cmd, wt) is not None, cmd


@pytest.mark.parametrize(
    "cmd",
    [
        "echo x > notes.txt 2>/dev/null",
        "mkdir -p .scratch && echo a > .scratch/b",
        "rm escape",  # removes the link, not its target
        "mv escape old-link",
        "sed -i 's/8/6/' refspec.toml",
        "git diff && git status",
        "python -c \"open('/tmp/x', 'w')\"",  # invisible to the hook: the sandbox's job
        "cat <<EOF > new.py\nprint('> /etc/passwd')\nEOF",
    ],
)
def test_bash_writes_inside_are_allowed(tree, cmd):
    wt, _ = tree
    assert bash(cmd, wt) is None, cmd


def test_bash_writes_resolves_cd_and_links(tree):
    wt, out = tree
    found = dict(bash_writes("cd refspec && echo x > y; cd ../escape && touch z", wt))
    assert found == {"y": wt / "refspec" / "y", "z": out / "z"}
