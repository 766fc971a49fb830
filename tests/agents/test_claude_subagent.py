"""A claude sub-agent through the real SDK and bundled CLI, against the loopback fake API, in a real
worktree of a real (shrunk) deployment, with the real controller behind its MCP tools.

The scripted model tries to write outside its worktree in every way the confinement layers cover
(a file tool, a Bash redirection, a program the hook cannot see into, a symlink) and does real
work inside; the test checks what exists on disk afterwards, what the model was shown, the diff,
the transcript, the cost, and that the key is nowhere the agent could see it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specpilot.agents.claude import ClaudeOptions, ClaudeSubAgent
from specpilot.agents.claude.transcript import read
from specpilot.agents.protocol import AgentError, Direction
from specpilot.agents.tools import LocalControllerTools
from specpilot.controller import protected_paths
from specpilot.memory_store import connect, records

from .claude_env import skip_without_cli, world
from .fake_api import Turn, text, tool_use

pytestmark = skip_without_cli()

DIRECTION = Direction(title="shorter drafts", hypothesis="fewer wasted rows per step", target_factor="kernel",
                      expected_gain=0.02, plan="set decode.block_size = 6 in refspec.toml")  # fmt: skip


def _tool_results(fake) -> dict[str, dict]:
    """tool_use id -> the tool_result block the CLI sent back to the model."""
    out = {}
    for r in fake.requests:
        for m in r.body["messages"]:
            if m["role"] == "user" and isinstance(m["content"], list):
                for b in m["content"]:
                    if b.get("type") == "tool_result":
                        out[b["tool_use_id"]] = b
    return out


def _text(block: dict) -> str:
    c = block["content"]
    return c if isinstance(c, str) else "".join(x.get("text", "") for x in c)


@pytest.fixture
def setup(tmp_path):
    home, dep, ws, _ = world(tmp_path, "smollm-agent")
    wt = ws.add_worktree("r1-d0", "system")
    outside = tmp_path / "outside"
    outside.mkdir()
    transcripts = home.transcripts / dep.name / "round-1"
    agent = ClaudeSubAgent(dep, ClaudeOptions(max_turns=30, budget_usd=5.0),
                           lambda w: transcripts / f"direction-{w.name.split('-d')[-1]}.jsonl", protected_paths(dep),
                           hidden=home.records)  # fmt: skip
    return home, dep, ws, wt, outside, agent


@pytest.mark.slow
def test_confined_run_collects_the_patch(setup, api):
    home, dep, ws, wt, outside, agent = setup
    env = tool_use("Bash", command="env; grep Cpus_allowed_list /proc/self/status", description="look")
    write_out = tool_use("Write", file_path=str(outside / "write.txt"), content="x")
    bash_out = tool_use("Bash", command=f"echo x > {outside}/bash.txt", description="write outside")
    hidden = tool_use("Bash", command=f"python -c \"open('{outside}/py.txt', 'w').write('x')\"; echo rc=$?",
                      description="a write the hook cannot see")  # fmt: skip
    link = tool_use("Bash", command=f"ln -s {outside} escape", description="link out")
    via_link = tool_use("Write", file_path=str(wt / "escape" / "via-link.txt"), content="x")
    unlink = tool_use(
        "Bash", command="rm escape && mkdir -p .scratch && echo notes > .scratch/n.txt", description="tidy"
    )
    git_add = tool_use("Bash", command="git add -A", description="stage")
    read_toml = tool_use("Read", file_path=str(wt / "refspec.toml"))
    edit = tool_use(
        "Edit", file_path=str(wt / "refspec.toml"), old_string="block_size = 8", new_string="block_size = 6"
    )
    audit = tool_use("mcp__controller__quick_audit")
    measure = tool_use("mcp__controller__quick_measure")
    db = home.root / "specpilot.db"  # the controller's records: each draw's tags and answers
    raw = home.runs / "earlier.jsonl"
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text('{"id": "r01", "tokens": [1, 2, 3]}\n')
    read_raw = tool_use("Read", file_path=str(raw))
    cat_db = tool_use("Bash", command=f"head -c 15 {db}; echo; echo rc=$?", description="peek at the records")
    fake = api([[text("Looking."), env], [write_out], [bash_out], [hidden], [link], [via_link], [unlink], [git_add],
                [read_toml], [edit], [audit], [measure], [read_raw], [cat_db],
                Turn([text("Set decode.block_size = 6 in refspec.toml.")], {"input_tokens": 5000, "output_tokens": 400})])  # fmt: skip
    tools = LocalControllerTools(dep, home, "system")
    patch = agent.implement(DIRECTION, wt, "cpu:1", tools)
    assert not fake.exhausted and fake.served == 15

    # Nothing was written outside the worktree, by any route.
    assert sorted(os.listdir(outside)) == []
    results = _tool_results(fake)
    assert "outside your worktree" in _text(results[write_out["id"]])
    assert "outside your worktree" in _text(results[bash_out["id"]])
    assert "Read-only file system" in _text(
        results[hidden["id"]]
    )  # the sandbox stopped what the hook could not see
    assert "outside your worktree" in _text(results[via_link["id"]])  # the link was resolved
    assert "writes the repository" in _text(results[git_add["id"]])
    # The controller's records are not read, by a tool (the hook) or by a shell (the sandbox).
    assert db.read_bytes()[:15] == b"SQLite format 3"
    assert "agents may not read" in _text(results[read_raw["id"]])
    assert "SQLite format" not in _text(results[cat_db["id"]]), _text(results[cat_db["id"]])

    # The agent's shell: no key, the slot exported, pinned to core 1.
    shell = _text(results[env["id"]])
    assert fake.key not in shell and "SPECPILOT_DEVICE=cpu:1" in shell
    assert "Cpus_allowed_list:\t1" in shell

    # The controller tools ran real controller code: an error the agent can read, and a real paired run
    assert results[audit["id"]].get("is_error") and "no Phase 0" in _text(results[audit["id"]])
    measured = json.loads(_text(results[measure["id"]]))
    assert "not a verdict" in measured["note"] and measured["gain"] > 0
    run = records.get_run(connect(home), measured["run_id"])
    # stored as a quick run: never counted as a judged ("paired") one
    assert run is not None and run.kind == "quick" and run.candidate_tree == measured["candidate_tree"]

    # The diff: exactly the knob change (scratch files and the sandbox's stubs are gone).
    assert (
        patch.diff.count("diff --git") == 1
        and "-block_size = 8" in patch.diff
        and "+block_size = 6" in patch.diff
    )
    assert not (wt / ".scratch").exists() and not (wt / ".claude").exists()
    assert not (ws.root / "repo" / ".git" / "config.worktree").exists()
    assert patch.summary == "Set decode.block_size = 6 in refspec.toml."

    # Transcript and cost, stored where the round shows them; the key in neither, nor in what the model saw.
    assert patch.transcript == home.transcripts / dep.name / "round-1" / "direction-0.jsonl"
    lines = read(patch.transcript)
    result = [x for x in lines if x["kind"] == "ResultMessage"][-1]["data"]
    assert patch.cost_usd == result["total_cost_usd"] > 0
    assert patch.usage["output_tokens"] == result["usage"]["output_tokens"] and patch.usage["num_turns"] == 15
    assert (
        sum(1 for x in lines if x["kind"] == "denied") == 5
    )  # write_out, bash_out, via_link, git_add, read_raw
    assert fake.key not in patch.transcript.read_text()
    assert all(fake.key not in json.dumps(r.body) for r in fake.requests)


def test_protected_path_is_a_failed_direction(setup, api):
    home, dep, ws, wt, outside, agent = setup
    target = wt / "refspec" / "serve.py"
    first = target.read_text().splitlines()[0]
    fake = api([[tool_use("Read", file_path=str(target))],
                [tool_use("Edit", file_path=str(target), old_string=first, new_string=first + "  # faster")],
                [text("Edited serve.py.")]])  # fmt: skip
    with pytest.raises(AgentError, match=r"touches protected paths: refspec/serve.py") as err:
        agent.implement(DIRECTION, wt, "cpu:0", LocalControllerTools(dep, home, "system"))
    assert fake.served == 3
    rec = err.value.record
    assert rec["cost_usd"] > 0 and Path(rec["transcript"]).is_file()  # the round stores them with the failure


def test_dollar_budget_stops_the_run(setup, api):
    home, dep, ws, wt, outside, agent = setup
    agent.options = ClaudeOptions(max_turns=30, budget_usd=0.5)
    expensive = {"input_tokens": 100_000, "output_tokens": 100_000}  # well over $0.50 at any Claude price
    fake = api([Turn([tool_use("Read", file_path=str(wt / "refspec.toml"))], expensive),
                Turn([text("more work")], expensive)])  # fmt: skip
    with pytest.raises(AgentError, match=r"dollar budget \$0.50 was exceeded") as err:
        agent.implement(DIRECTION, wt, "cpu:0", LocalControllerTools(dep, home, "system"))
    assert fake.served == 1  # the CLI stopped before asking for another turn
    assert err.value.record["cost_usd"] > 0.5


def test_without_the_sandbox_no_command_runs(setup, api, tmp_path, monkeypatch):
    """Fail closed: no bubblewrap on PATH, no run at all; a bubblewrap that cannot create its
    namespaces (a locked-down container), no Bash command runs (the CLI wraps each one in it)."""
    home, dep, ws, wt, outside, agent = setup
    tools = LocalControllerTools(dep, home, "system")
    path = os.environ["PATH"]
    fake = api([])
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(
        AgentError, match=r"Bash sandbox needs bwrap and socat.*apt-get install bubblewrap socat"
    ):
        agent.implement(DIRECTION, wt, "cpu:0", tools)
    assert fake.served == 0

    broken = tmp_path / "bin"
    broken.mkdir()
    (broken / "bwrap").write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create a new namespace' >&2\nexit 1\n"
    )
    (broken / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{broken}{os.pathsep}{path}")
    write = tool_use(
        "Bash", command=f"python -c \"open('{outside}/py.txt', 'w')\"; touch inside.txt", description="x"
    )
    fake = api([[write], [text("done")]])
    with pytest.raises(AgentError, match="changed nothing"):
        agent.implement(DIRECTION, wt, "cpu:0", tools)
    assert "No permissions" in _text(_tool_results(fake)[write["id"]])
    assert os.listdir(outside) == [] and not (wt / "inside.txt").exists()
