"""The τ/c decomposition and the three ceiling factors on step profiles built here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specpilot.costmodel import decompose, load_profile, load_records, replay_table
from specpilot.costmodel.analytic import DrafterShape, StepShape, step_work
from specpilot.costmodel.devices import H100_SXM5
from specpilot.costmodel.replay import Replay, ReplayTable
from specpilot.deployments import SpecPilotError, load_deployment

from .builders import humaneval_record, mtbench_record, profile_dict, write_records

QWEN = load_deployment("qwen27b-h100")
MS = 1e-3
# Paper-shaped step on H100 (§2.1, §4.1, §4.2): GEMMs 17.88 ms, BF16 LM head 878 µs, GDN path
# verification 1485 µs, drafter 1.05 ms; the step 23.61 ms. Attention, other and T_AR are ours.
PAPER_CLASSES = {
    "linear": 17.88 * MS,
    "attention": 0.30 * MS,
    "recurrent": 1.485 * MS,
    "lm_head": 0.878 * MS,
    "drafter": 1.05 * MS,
    "other": 0.50 * MS,
}


def write_profile(tmp_path: Path, **over) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile_dict(**over)))
    return path


def paper_table() -> ReplayTable:
    """§4.2's exact-replay figures as a table: chain 4.25, best-first 32 nodes 5.38, 16 nodes 5.03,
    top-4 tree at 16 nodes 5.02, oracle 6.42 (tokens / steps over 100 steps)."""
    taus = {
        ("chain", 16): 4.25,
        ("chain", 32): 4.25,
        ("best_first", 16): 5.03,
        ("best_first", 32): 5.38,
        ("best_first_marginal", 16): 4.90,
        ("best_first_marginal", 32): 5.20,
        ("topk", 16): 5.02,
        ("topk", 32): 5.30,
    }
    results = [Replay(p, b, round(t * 100), 100) for (p, b), t in taus.items()]
    results.append(Replay("oracle", None, 642, 100))
    return ReplayTable([16, 32], results, requests=1, block_size=8)


def test_paper_shaped_step(tmp_path: Path) -> None:
    prof = load_profile(
        write_profile(
            tmp_path,
            classes=PAPER_CLASSES,
            step_wall_s=23.61 * MS,
            ar_step_wall_s=19.5 * MS,
            rows_per_step=33.0,
            block_size=32,
        )
    )
    r = decompose(prof, QWEN, H100_SXM5, paper_table(), budget=32, system="abc")
    assert r.c == pytest.approx(23.61 / 19.5)
    assert r.speedup == pytest.approx(4.25 / (23.61 / 19.5))
    assert r.speedup == pytest.approx(r.tau / r.c)
    # F_tree from exact replay: the best tree at 32 nodes is the conditioned best-first one.
    assert (r.best_policy, r.tau_best) == ("best_first", pytest.approx(5.38))
    assert r.f_tree == pytest.approx(5.38 / 4.25)
    assert r.tau_chain_replay == pytest.approx(4.25)
    # F_outside = step wall / profiled kernel time.
    profiled = sum(PAPER_CLASSES.values())
    assert r.profiled_s == pytest.approx(profiled)
    assert r.f_outside == pytest.approx(23.61 * MS / profiled)
    # F_kernel = profiled / Σ floors, the floors from the analytic model at N = 33 rows.
    work = step_work(
        QWEN.target.arch, "bfloat16", DrafterShape("dflash2", 1_700_000_000, 8), StepShape(33, 1, 2000)
    )
    floor = sum(w.floor_s(H100_SXM5, "bfloat16") for w in work.values())
    assert r.floor_s == pytest.approx(floor)
    assert r.f_kernel == pytest.approx(profiled / floor)
    # The recurrent class runs below its per-node floor here (the paper's 1485 µs path kernel vs
    # 3.3 ms at 33 rows): kept as measured.
    rec = next(c for c in r.classes if c.name == "recurrent")
    assert rec.ratio < 1
    # The ceiling is the product, and it telescopes to τ_best × T_AR / floor.
    assert r.ceiling == pytest.approx(r.speedup * r.f_tree * r.f_kernel * r.f_outside)
    assert r.ceiling == pytest.approx(5.38 * 19.5 * MS / floor)
    assert r.largest == "tree" and r.f_tree == max(r.factors.values())
    data = json.loads(json.dumps(r.to_dict()))
    assert data["factors"] == pytest.approx(r.factors)
    assert {c["name"] for c in data["classes"]} == set(PAPER_CLASSES)
    assert data["replay"]["tau"]["oracle"] == pytest.approx(6.42)


@pytest.mark.parametrize(
    ("over", "largest"),
    [
        ({"step_wall_s": 0.080, "ar_step_wall_s": 0.030}, "outside"),  # profiled 30 ms of 80
        ({"classes": {"linear": 0.2, "lm_head": 0.01}, "step_wall_s": 0.22}, "kernel"),
    ],
)
def test_largest_factor(tmp_path: Path, over: dict, largest: str) -> None:
    records = load_records(write_records(tmp_path / "r.jsonl", [humaneval_record()]))
    prof = load_profile(write_profile(tmp_path, tau=2.0, **over))
    r = decompose(prof, QWEN, H100_SXM5, replay_table(records))
    assert r.budget == 8  # the profile's block size
    assert r.tau_best == pytest.approx(4.0)  # the hand-built record's best tree at 8 nodes
    assert r.largest == largest
    assert r.factors[largest] == max(r.factors.values())


def test_without_a_recording_f_tree_is_one_and_noted(tmp_path: Path) -> None:
    prof = load_profile(write_profile(tmp_path, dtype="float32"))
    r = decompose(prof, QWEN, H100_SXM5, None)
    assert r.f_tree == 1.0 and r.best_policy == "unmeasured"
    assert any("no recording" in n for n in r.notes)
    assert any("float32" in n for n in r.notes)  # ran in another dtype than the deployment's


def test_a_target_without_recurrent_layers_has_no_recurrent_row(tmp_path: Path) -> None:
    smollm = load_deployment("smollm-h200")
    prof = load_profile(write_profile(tmp_path))
    names = [c.name for c in decompose(prof, smollm, H100_SXM5, None).classes]
    assert names == ["linear", "attention", "lm_head", "drafter", "other"]


def test_chain_replay_disagreeing_with_the_profile_is_noted(tmp_path: Path) -> None:
    records = load_records(write_records(tmp_path / "r.jsonl", [humaneval_record(), mtbench_record()]))
    prof = load_profile(write_profile(tmp_path, tau=3.0))
    r = decompose(prof, QWEN, H100_SXM5, replay_table(records))
    assert any("differs from the profiled" in n for n in r.notes)


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"classes": {"linear": 0.01, "gemm": 0.01}}, "unknown kernel classes"),
        ({"profiled_s": 1.0}, "not the sum of classes"),
        ({"tau": 0}, "field `tau`"),
        ({"steps": "many"}, "field `steps`"),
    ],
)
def test_bad_profiles_are_named(tmp_path: Path, over: dict, message: str) -> None:
    path = write_profile(tmp_path, **over)
    with pytest.raises(SpecPilotError, match=message) as e:
        load_profile(path)
    assert str(path) in str(e.value)


def test_profile_file_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecPilotError, match="no such profile"):
        load_profile(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(SpecPilotError, match="not JSON"):
        load_profile(bad)
    missing = profile_dict()
    del missing["ar_step_wall_s"]
    bad.write_text(json.dumps(missing))
    with pytest.raises(SpecPilotError, match="ar_step_wall_s"):
        load_profile(bad)


def test_extra_profile_fields_are_kept(tmp_path: Path) -> None:
    prof = load_profile(write_profile(tmp_path, node_budget=16, batch=1))
    assert prof.extra == {"node_budget": 16, "batch": 1}
    assert prof.to_dict()["node_budget"] == 16
    with pytest.raises(ValueError, match="budget 16 was not replayed"):
        decompose(prof, QWEN, H100_SXM5, paper_table().__class__([8], [], 0, 8))


def test_profiler_overhead_is_flagged(tmp_path: Path) -> None:
    # Class times summing past the step's wall time can only come from the profiler's own cost.
    prof = load_profile(write_profile(tmp_path, step_wall_s=0.025))
    r = decompose(prof, QWEN, H100_SXM5, None)
    assert r.f_outside < 1
    assert any("exceeds the step wall time" in n for n in r.notes)
