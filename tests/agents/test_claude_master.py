"""The claude master through the real SDK and the bundled Claude Code CLI, against the loopback fake API.

The planning context comes from a real workspace and the real built-in memory; the CLI validates the
structured output against the Direction schema, and the master validates it again.
"""

from __future__ import annotations

import json

import pytest

from specpilot.agents.claude import ClaudeMaster, ClaudeOptions
from specpilot.agents.claude.master import directions_schema, parse_directions
from specpilot.agents.claude.transcript import read
from specpilot.agents.protocol import AgentError, Direction
from specpilot.controller import protected_paths

from .claude_env import planning_context, skip_without_cli, world
from .fake_api import text, tool_use

GOOD = [
    {"title": "verify a best-first tree of 16 nodes", "hypothesis": "the drafter's top-16 holds the target token",
     "target_factor": "tree", "expected_gain": 0.2, "plan": "build the tree in generate.py with kernels.tree"},
    {"title": "retune block size", "hypothesis": "shorter drafts waste fewer rows", "target_factor": "kernel",
     "expected_gain": 0.03, "plan": "set decode.block_size = 6",
     "knob": {"knob": "decode.block_size", "file": "refspec.toml", "value": 6}},
]  # fmt: skip


@pytest.fixture
def planned(tmp_path):
    home, dep, ws, memory = world(tmp_path)
    ctx = planning_context(dep, ws, memory)
    master = ClaudeMaster(dep, ClaudeOptions(max_turns=8, budget_usd=2.0), ws.root / "repo",
                          home.transcripts / dep.name / "round-1" / "master.jsonl", protected_paths(dep))  # fmt: skip
    return master, ctx


@skip_without_cli()
def test_master_plans_directions_from_the_context(planned, api):
    master, ctx = planned
    fake = api([[text("Planning."), tool_use("StructuredOutput", directions=GOOD)]])
    directions = master.plan(ctx)
    assert [d.model_dump(exclude_none=True) for d in directions] == GOOD
    assert [d.key for d in directions][1] == "knob:refspec.toml:decode.block_size=6"

    # The model saw the rendered planning context: deployment, largest factor, memory, slots.
    first = json.dumps(fake.requests[0].body["messages"])
    for needle in (
        "smollm-cpu",
        "largest factor: **kernel**",
        "refspec-knobs",
        "decode.block_size",
        "cpu:0, cpu:1",
    ):
        assert needle in first, needle
    tools = {t["name"] for t in fake.requests[0].body["tools"]} - {"DeferredToolPlaceholder"}  # the CLI's own
    assert tools == {"Glob", "Grep", "Read", "StructuredOutput"}  # read-only, nothing else
    schema = next(t for t in fake.requests[0].body["tools"] if t["name"] == "StructuredOutput")[
        "input_schema"
    ]
    assert schema["properties"]["directions"]["maxItems"] == 2

    # Transcript and cost are stored, the key is in neither the transcript nor anything the model saw.
    assert master.record["cost_usd"] > 0
    lines = read(master.transcript)
    result = [x for x in lines if x["kind"] == "ResultMessage"][-1]["data"]
    assert master.record["cost_usd"] == result["total_cost_usd"]
    assert master.record["usage"]["input_tokens"] == result["usage"]["input_tokens"]
    assert fake.key not in master.transcript.read_text()
    assert all(fake.key not in json.dumps(r.body) for r in fake.requests)
    assert all(r.headers["x-api-key"] == fake.key for r in fake.requests)  # the CLI did authenticate


@skip_without_cli()
def test_malformed_direction_is_rejected_with_the_field_named(planned, api):
    master, ctx = planned
    bad = [{**GOOD[0], "target_factor": "speed"}]
    # The model answers with a bad direction, is told why by the CLI's schema check, then gives up.
    fake = api(
        [[tool_use("StructuredOutput", directions=bad)], [text("I cannot fix that.")], [text("Still no.")]]
    )
    with pytest.raises(AgentError) as err:
        master.plan(ctx)
    msg = str(err.value)
    assert "returned no directions" in msg and "target_factor" in msg, msg
    assert err.value.record["transcript"] == str(master.transcript) and master.transcript.is_file()
    assert fake.served >= 2


def test_parse_directions_names_the_problem():
    record = {"transcript": "t.jsonl"}
    with pytest.raises(
        AgentError, match=r"direction 1 is malformed: expected_gain: Input should be less than or equal to 10"
    ):
        parse_directions(
            {"directions": [GOOD[0], {**GOOD[0], "title": "other", "expected_gain": 50}]}, 2, [], record
        )
    with pytest.raises(AgentError, match=r"direction 0 is malformed: plan: Field required"):
        parse_directions({"directions": [{k: v for k, v in GOOD[0].items() if k != "plan"}]}, 2, [], record)
    with pytest.raises(AgentError, match="3 directions for 2 slots"):
        parse_directions({"directions": [GOOD[0]] * 3}, 2, [], record)
    with pytest.raises(AgentError, match="directions 0 and 1 are the same"):
        parse_directions({"directions": [GOOD[0], GOOD[0]]}, 2, [], record)
    with pytest.raises(AgentError, match="no list `directions`"):
        parse_directions({"plans": []}, 2, [], record)
    assert parse_directions({"directions": []}, 2, [], record) == []


def test_schema_is_the_direction_model():
    schema = directions_schema(3)
    item = schema["properties"]["directions"]["items"]
    assert item["properties"].keys() == Direction.model_json_schema()["properties"].keys()
    assert item["properties"]["target_factor"]["enum"] == ["tree", "kernel", "outside", "none"]
    assert "KnobChange" in schema["$defs"] and schema["properties"]["directions"]["maxItems"] == 3
