"""The offline memory agent on a real workspace and the real built-in refspec bundle."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from specpilot.agents.memory_backend import MemoryMaster, MemorySubAgent
from specpilot.agents.protocol import AgentError, Direction, KnobChange, PlanningContext
from specpilot.deployments import Home, load_deployment
from specpilot.deployments.stock import stock_tree_path
from specpilot.memory_store import builtin_bundles, open_memory
from specpilot.memory_store.workspace import Workspace
from specpilot.orchestrator import sealing


@pytest.fixture
def world(tmp_path):
    home = Home(tmp_path / "home")
    dep = load_deployment("smollm-cpu")
    ws, _ = Workspace.init(home, dep)
    memory = open_memory(home)
    sealing.ensure_builtin(memory, dep)
    return home, dep, ws, memory


def _ctx(dep, ws, memory, past=(), factors=None):
    return PlanningContext(
        deployment=dep.name, engine=dep.engine, system_tree=ws.system_tree, system_entries=[],
        costmodel={"factors": factors or {"tree": 1.1, "kernel": 2.0, "outside": 1.0}},
        memory=sealing.memory_summary(memory, dep), past=list(past), slots=["cpu:0", "cpu:1"],
        knobs=sealing.knob_values(ws, "system", memory, dep),
    )  # fmt: skip


def test_plans_one_direction_per_slot_deterministically(world):
    _, dep, ws, memory = world
    ctx = _ctx(dep, ws, memory)
    first, again = MemoryMaster().plan(ctx), MemoryMaster().plan(ctx)
    assert [d.key for d in first] == [d.key for d in again]
    assert len(first) == 2
    # The kernel factor is the largest, and draft confidence has a recorded smollm-cpu gain.
    assert first[0].entry == "refspec-draft-confidence" and first[0].target_factor == "kernel"
    assert first[0].expected_gain > 0.05


def test_knob_retunes_spread_over_knobs_smallest_step_first(world):
    _, dep, ws, memory = world
    ctx = _ctx(dep, ws, memory)
    ctx = dataclasses.replace(ctx, memory=[e for e in ctx.memory if e["name"] == "refspec-knobs"])
    assert ctx.knobs["refspec.toml:decode.block_size"] == 8
    first = MemoryMaster().plan(ctx)
    knobs = [d.knob.knob for d in first]
    assert len(first) == 2 and len(set(knobs)) == 2  # the slots are spread over different knobs
    block = next(d for d in first if d.knob.knob == "decode.block_size")
    # The smallest step from 8 among 4, 6, 12, 16 (the bundle's recorded 1.6% for 4 was rejected by
    # the controller, so it ranks nothing).
    assert block.knob.value == 6


def test_never_repeats_a_direction_judged_on_the_same_system(world):
    _, dep, ws, memory = world
    first = MemoryMaster().plan(_ctx(dep, ws, memory))
    past = [{"key": d.key, "baseline_tree": ws.system_tree} for d in first]
    second = MemoryMaster().plan(_ctx(dep, ws, memory, past))
    assert not {d.key for d in first} & {d.key for d in second}
    # Judged on another system: allowed again.
    other = [{"key": d.key, "baseline_tree": "0" * 40} for d in first]
    assert [d.key for d in MemoryMaster().plan(_ctx(dep, ws, memory, other))] == [d.key for d in first]


def test_recorded_gains_rank_first(world):
    _, dep, ws, memory = world
    # Within the largest factor (tree here), a knob value with a recorded 4% gain on this
    # deployment ranks above the tree entry (its recorded 2.7% was rejected, so it counts for
    # nothing) and every unmeasured direction.
    ctx = _ctx(dep, ws, memory, factors={"tree": 2.0, "kernel": 1.1, "outside": 1.0})
    knobs = next(e for e in ctx.memory if e["name"] == "refspec-knobs")
    knobs["evidence"] = [{"deployment": dep.name, "knob": "drafter.max_ngram", "value": 2, "gain": 1.04}]
    plan = MemoryMaster().plan(ctx)
    assert plan[0].knob.knob == "drafter.max_ngram" and plan[0].knob.value == 2
    assert plan[1].entry == "refspec-tree-verify"


def test_a_hybrid_only_entry_is_offered_only_for_a_target_with_gdn_layers(world):
    _, dep, _, memory = world
    summary = {e["name"]: e for e in sealing.memory_summary(memory, dep)}
    assert not summary["refspec-gdn-tree"]["applicable"]  # SmolLM2 has no GDN layer
    assert summary["refspec-tree-verify"]["applicable"]
    hybrid = load_deployment("qwen27b-h100")  # 48 of 64 layers GDN
    assert hybrid.target.arch.gdn_layers == 48
    assert sealing.fits_target({"target": "hybrid"}, hybrid) and not sealing.fits_target(
        {"target": "hybrid"}, dep
    )
    assert sealing.fits_target({}, dep)


def test_a_gpu_only_entry_is_offered_only_on_gpu_slots(world):
    _, dep, _, memory = world
    summary = {e["name"]: e for e in sealing.memory_summary(memory, dep)}
    assert dep.devices.kind == "cpu" and not summary["refspec-tlv"]["applicable"]
    gpu = load_deployment("smollm-h200")
    assert sealing.fits_target({"target": "gpu"}, gpu) and not sealing.fits_target({"target": "gpu"}, dep)


def test_a_read_bound_entry_is_offered_only_where_the_per_phase_kernels_run(world):
    _, dep, _, memory = world
    summary = {e["name"]: e for e in sealing.memory_summary(memory, dep)}
    assert not summary["refspec-w12"]["applicable"]
    wide, smollm = load_deployment("wide-h200"), load_deployment("smollm-h200")
    assert sealing.fits_target({"target": "read-bound"}, wide)  # 724 MB a layer
    assert not sealing.fits_target({"target": "read-bound"}, smollm)  # 7 MB a layer: the persistent pass
    assert not sealing.fits_target({"target": "read-bound"}, dep)
    cuda_graphs = (stock_tree_path("refspec") / "refspec" / "cuda_graphs.py").read_text()
    assert f"PERSIST_MAX_LAYER_BYTES = {sealing.READ_BOUND_LAYER_BYTES >> 20} << 20" in cuda_graphs


def test_a_batch_only_entry_is_offered_only_on_a_batch_deployment(world):
    _, dep, _, memory = world
    summary = {e["name"]: e for e in sealing.memory_summary(memory, dep)}
    assert dep.serving.shape == "single" and not summary["refspec-shared-budget"]["applicable"]
    assert summary["refspec-adaptive-block"]["applicable"]  # a per-request block acts on one request too
    batch = load_deployment("smollm-cpu-batch")
    assert sealing.fits_target({"target": "batch"}, batch) and not sealing.fits_target(
        {"target": "batch"}, dep
    )


def test_sub_agent_edits_one_line_and_applies_entry_deltas(world):
    home, dep, ws, memory = world
    wt = ws.add_worktree("knob")
    d = Direction(title="retune", hypothesis="hyp", target_factor="tree", expected_gain=0.0, plan="plan",
                  knob=KnobChange(knob="decode.block_size", file="refspec.toml", value=6))  # fmt: skip
    patch = MemorySubAgent({}).implement(d, wt, "cpu:0", tools=None)
    assert patch.diff.count("\n-block_size") == 1 and "+block_size = 6" in patch.diff
    # An entry's delta (requirements first) applies with real git.
    wt2 = ws.add_worktree("entry")
    delta = patch.diff
    e = Direction(
        title="apply x", hypothesis="hyp", target_factor="tree", expected_gain=0.0, plan="plan", entry="x"
    )
    applied = MemorySubAgent({"x": [("x", delta)]}).implement(e, wt2, "cpu:0", tools=None)
    assert applied.diff == patch.diff


def test_entries_made_on_stock_stack_by_three_way_merge_or_name_the_conflict(world):
    """The built-in mechanisms add files only, so each applies onto a system holding the others;
    two retunes of the same stock line truly conflict, and the conflict is named file by file."""
    _, dep, ws, memory = world
    bundle = builtin_bundles()["refspec"]
    names = ("refspec-draft-confidence", "refspec-certified-head", "refspec-tree-verify")
    knob = {n: stock_knob_patch(ws, n, v) for n, v in (("block4", 4), ("block12", 12))}
    agent = MemorySubAgent(
        {n: [(n, (bundle / f"{n}.patch").read_text())] for n in names}
        | {n: [(n, d)] for n, d in knob.items()}
    )

    def direction(name: str) -> Direction:
        return Direction(title=f"apply {name}", hypothesis="from memory", target_factor="kernel",
                         expected_gain=0.0, plan="apply it", entry=name)  # fmt: skip

    base = "system"
    for i, name in enumerate(names):
        wt = ws.add_worktree(f"m{i}", base)
        patch = agent.implement(direction(name), wt, "cpu:0", tools=None)
        assert "\n-" not in patch.diff.replace("\n--- ", "\n"), f"{name} edits a stock line"
        ws.commit_worktree(wt, name)
        base = f"cand/m{i}"
    stacked = ws.root / "worktrees" / "m2"
    assert {p.name for p in (stacked / "knobs").iterdir()} == {
        "draft_confidence.toml", "certified_head.toml", "tree.toml"}  # fmt: skip

    wt = ws.add_worktree("b4")
    agent.implement(direction("block4"), wt, "cpu:0", tools=None)
    ws.commit_worktree(wt, "block4")
    on_b4 = ws.add_worktree("b12", "cand/b4")
    with pytest.raises(AgentError, match=r"conflicts with the system's code in refspec\.toml"):
        agent.implement(direction("block12"), on_b4, "cpu:0", tools=None)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=on_b4, capture_output=True, text=True)
    assert status.stdout == ""  # no conflict markers or half-applied files left


def stock_knob_patch(ws, name: str, block: int) -> str:
    """A patch against stock that sets decode.block_size (a retune of one stock line)."""
    wt = ws.add_worktree(f"knob-{name}")
    toml = wt / "refspec.toml"
    toml.write_text(toml.read_text().replace("block_size = 8 ", f"block_size = {block} "))
    out = subprocess.run(["git", "diff"], cwd=wt, capture_output=True, text=True, check=True).stdout
    ws.remove_worktree(f"knob-{name}")
    assert out
    return out
