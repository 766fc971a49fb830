"""The claude backend wired into the round: `specpilot round --agent claude`'s choices and errors, and
the round's plan and implement steps through the real SDK and CLI against the loopback fake API,
with transcripts, tokens and cost kept in the round state and shown in its report."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from specpilot.agents.claude import ClaudeMaster, ClaudeSubAgent
from specpilot.agents.protocol import AgentError
from specpilot.orchestrator.agents import agent_options, default_agent, make_agents
from specpilot.orchestrator.reports import round_panel
from specpilot.orchestrator.round import start_or_resume

from ..conftest import run_cli
from .claude_env import skip_without_cli, world
from .fake_api import Turn, text, tool_use

FREE = {"title": "shorter drafts", "hypothesis": "fewer wasted rows per verify step", "target_factor": "kernel",
        "expected_gain": 0.02, "plan": "edit refspec.toml: decode.block_size = 6"}  # fmt: skip


def test_default_agent_and_options(tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert default_agent() == "memory"
    with pytest.raises(AgentError, match="needs an API key: set ANTHROPIC_API_KEY"):
        agent_options("claude", world_home(tmp_path))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    assert default_agent() == "claude"
    from specpilot.agents import claude

    if claude.sdk_missing() or claude.sandbox_missing():
        pytest.skip(claude.sdk_missing() or claude.sandbox_missing())
    home = world_home(tmp_path)
    (home.root / "claude.toml").write_text('model = "claude-sonnet-4-5"\nmax_turns = 40\nbudget_usd = 3.0\n')
    opts = agent_options("claude", home, max_turns=12, budget_usd=None)  # the round's option wins
    assert (opts["model"], opts["max_turns"], opts["budget_usd"]) == ("claude-sonnet-4-5", 12, 3.0)
    (home.root / "claude.toml").write_text("max_turns = 0\ncolour = 1\n")
    with pytest.raises(AgentError, match=r"claude.toml or the round options\): max_turns: .*colour: Extra"):
        agent_options("claude", home)
    assert agent_options("memory", home) == {}


def world_home(tmp_path):
    from specpilot.deployments import Home

    home = Home(tmp_path / "h")
    home.root.mkdir(parents=True, exist_ok=True)
    return home


def test_cli_claude_without_a_key_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    proc = run_cli("round", "--deployment", "smollm-cpu", "--agent", "claude", home=tmp_path / "h")
    assert proc.returncode == 2, proc.stderr
    assert "needs an API key: set ANTHROPIC_API_KEY" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "h" / "workspaces").exists()  # refused before anything was set up


@skip_without_cli()
def test_round_plans_and_implements_with_claude(tmp_path, api):
    home, dep, ws, _ = world(tmp_path, "smollm-agent")
    toml = ws.root / "repo" / "refspec.toml"
    fake = api([
        [text("One direction."), tool_use("StructuredOutput", directions=[FREE])],  # the master
        [tool_use("Read", file_path="refspec.toml")],  # the sub-agent (its cwd is its worktree)
        Turn([tool_use("Edit", file_path="refspec.toml", old_string="block_size = 8", new_string="block_size = 6")],
             {"input_tokens": 3000, "output_tokens": 200}),
        [text("decode.block_size = 6")],
    ])  # fmt: skip
    rnd = start_or_resume(
        dep, home, "claude", None, lambda *_: None, agent_options("claude", home, max_turns=10)
    )
    master, sub = make_agents("claude", rnd)
    assert isinstance(master, ClaudeMaster) and isinstance(sub, ClaudeSubAgent)
    rnd.state.costmodel = {"tau": 2.6, "c": 1.4, "speedup": 1.8, "largest": "kernel", "notes": [],
                              "factors": {"tree": 1.3, "kernel": 2.0, "outside": 1.0}}  # fmt: skip
    rnd.plan()
    rnd.implement()
    assert fake.served == 4 and not fake.exhausted
    assert [d["title"] for d in rnd.state.directions] == [FREE["title"]]

    folder = home.transcripts / dep.name / f"round-{rnd.number}"
    m, p = rnd.state.master, rnd.state.patches["0"]
    assert m["transcript"] == str(folder / "master.jsonl") and m["cost_usd"] > 0
    assert p["transcript"] == str(folder / "direction-0.jsonl") and p["cost_usd"] > 0 and "error" not in p
    assert p["usage"]["output_tokens"] >= 200 and p["summary"] == "decode.block_size = 6"
    assert rnd.state.agent_options["max_turns"] == 10
    assert "block_size = 8" in toml.read_text()  # the system is untouched; the change is on its branch
    assert "+block_size = 6" in ws.git("diff", "system", p["branch"])

    # Stored in the database (what --resume and `specpilot round-report` read), shown in the report.
    from specpilot.memory_store import connect, records

    stored = records.get_round(connect(home), dep.name, rnd.number).state
    assert stored["patches"]["0"]["cost_usd"] == p["cost_usd"] and stored["master"] == m
    con = Console(width=250, record=True)
    con.print(round_panel(dep.name, rnd.number, "running", stored))
    out = con.export_text()
    assert "agent runs" in out and str(folder / "direction-0.jsonl") in out
    assert f"${p['cost_usd']:.2f}" in out and f"${m['cost_usd'] + p['cost_usd']:.2f}" in out
    assert fake.key not in json.dumps(stored)
