"""A round's combination of approved patches, on a real workspace with real entry patches.

Deterministic: the merge of the patches is git's three-way merge, and a combination of one
surviving patch is kept without being judged again, so no timing enters these tests. (A merge of
two or more patches is judged against the best single patch by the controller; the round tests
and the main job exercise that.)
"""

from __future__ import annotations

import pytest

from specpilot.agents.memory_backend import MemorySubAgent
from specpilot.agents.protocol import Direction
from specpilot.deployments import Home, load_deployment
from specpilot.memory_store import builtin_bundles, open_memory, records, replay
from specpilot.memory_store.workspace import Workspace
from specpilot.orchestrator import sealing
from specpilot.orchestrator.round import Round
from specpilot.orchestrator.roundview import RoundState


@pytest.fixture
def world(tmp_path):
    home = Home(tmp_path / "home")
    dep = load_deployment("smollm-cpu")
    ws, _ = Workspace.init(home, dep)
    memory = open_memory(home)
    sealing.ensure_builtin(memory, dep)
    return home, dep, ws, memory


def _apply(ws: Workspace, name: str, entry: str, patch: str) -> str:
    """A candidate branch: stock + the patch, committed as the round's sub-agent would."""
    wt = ws.add_worktree(name, "system")
    d = Direction(
        title=f"apply {entry}",
        hypothesis="from memory",
        target_factor="tree",
        expected_gain=0.0,
        plan="apply it",
        entry=entry,
    )
    MemorySubAgent({entry: [(entry, patch)]}).implement(d, wt, "cpu:0", tools=None)
    return ws.commit_worktree(wt, entry)


def _retune(ws: Workspace, name: str, block: int) -> str:
    wt = ws.add_worktree(name, "system")
    toml = wt / "refspec.toml"
    toml.write_text(toml.read_text().replace("block_size = 8 ", f"block_size = {block} "))
    return ws.commit_worktree(wt, f"block_size = {block}")


def test_independent_patches_merge_into_the_tree_their_entries_replay_to(world):
    home, dep, ws, memory = world
    bundle = builtin_bundles()["refspec"]
    for name, entry in (("tree", "refspec-tree-verify"), ("dc", "refspec-draft-confidence")):
        _apply(ws, name, entry, (bundle / f"{entry}.patch").read_text())
    commit, applied, dropped = sealing.merge_patches(
        ws, "both", "system", [("0", "cand/tree"), ("1", "cand/dc")]
    )
    assert applied == ["0", "1"] and dropped == {}
    tree = ws.tree_hash(commit)
    assert tree == replay(memory, dep, ["refspec-tree-verify", "refspec-draft-confidence"]).tree


def test_a_conflicting_patch_is_left_out_and_named_in_the_round(world):
    home, dep, ws, memory = world
    trees = {"0": _retune(ws, "b12", 12), "1": _retune(ws, "b6", 6)}
    state = {
        "agent": "memory",
        "baseline": {"commit": ws.commit("system"), "tree": ws.system_tree, "entries": []},
        "directions": [{"title": t, "target_factor": "tree"} for t in ("block 12", "block 6")],
        "patches": {i: {"branch": f"cand/{b}", "tree": trees[i]} for i, b in (("0", "b12"), ("1", "b6"))},
        "evaluations": {"0": {"approved": True, "gain": 1.05}, "1": {"approved": True, "gain": 1.03}},
    }
    rnd = Round(dep, home, 1, RoundState.from_json(state), lambda *_: None)
    comb = sealing.combine(rnd)
    assert comb["kind"] == "single" and comb["applied"] == ["0"] and comb["tree"] == trees["0"]
    assert comb["dropped"] == {"1": "conflicts with direction 0 in refspec.toml"}
    from rich.console import Console

    from specpilot.orchestrator.reports import round_panel

    con = Console(width=100, record=True)
    con.print(round_panel(dep.name, 1, "done", state | {"combination": comb}))
    text = con.export_text()
    assert "left out: direction 1 (block 6): conflicts with direction 0 in refspec.toml" in " ".join(
        text.split()
    )


def test_a_merge_left_out_is_named_with_the_controllers_reason():
    """A merge that got no verdict (a disturbed measurement) is not reported as one that lost."""
    refused = {"gain": 0.0, "lower_bound": 0.0,
               "reasons": ["measurement disturbed in 2 of 2 blocks (a slot throttled (software power cap)): no verdict"]}  # fmt: skip
    assert sealing.merge_left_out("0", refused) == (
        "the merge with direction 0 got no verdict against it alone (measurement disturbed in 2 of 2 blocks "
        "(a slot throttled (software power cap)): no verdict)"
    )
    lost = {
        "gain": 1.004,
        "lower_bound": 0.998,
        "reasons": ["lower bound -0.20% does not exceed 1% + 2σ = 1.17%"],
    }
    assert sealing.merge_left_out("1", lost) == (
        "the merge with direction 1 did not beat it alone (gain 1.004, lower bound 0.998: "
        "lower bound -0.20% does not exceed 1% + 2σ = 1.17%)"
    )


def test_a_round_budget_leaves_each_later_direction_its_first_look(world):
    """`controller.round_budget_s`: the next comparison may measure what the round's budget has left,
    less the time to a first look (Phase 0's noise run) for each direction still to judge after it."""
    home, _, ws, _ = world
    dep = load_deployment("smollm-cpu")
    base = {"commit": ws.commit("system"), "tree": ws.system_tree, "entries": []}
    rnd = Round(dep, home, 1, RoundState.from_json({"agent": "memory", "baseline": base}), lambda *_: None)

    def budget(s: float | None):
        return dep.model_copy(update={"controller": dep.controller.model_copy(update={"round_budget_s": s})})

    rnd.dep = budget(None)
    assert rnd.judging_left(1) is None  # no round budget: each comparison its deployment's budget_s
    rnd.dep = budget(300.0)
    records.set_state(rnd.db, dep.name, "noise", {"look_s": 55.0})
    assert rnd.judging_left(2) == 300.0 - 2 * 55.0
    assert rnd.judging_left(0) == 300.0
