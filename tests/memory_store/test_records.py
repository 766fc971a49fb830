"""The controller's and orchestrator's records (CONTRACTS §7), on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC

import pytest

from specpilot.deployments import SpecPilotError
from specpilot.memory_store import records as R

BASE, CAND = "a" * 40, "b" * 40


def test_run_lifecycle(memory):
    db = memory.db
    run_id = R.add_run(db, "smollm-cpu", "paired", BASE, CAND, raw_path="runs/x.jsonl")
    run = R.get_run(db, run_id)
    assert (run.status, run.candidate_tree, run.finished_at) == ("running", CAND, None)
    assert run.created_at.tzinfo == UTC
    done = R.finish_run(db, run_id, summary={"gain": 1.04, "blocks": [1.03, 1.05]})
    assert done.status == "done" and done.summary == {"gain": 1.04, "blocks": [1.03, 1.05]}
    assert done.finished_at >= done.created_at
    with pytest.raises(SpecPilotError, match="already done"):
        R.fail_run(db, run_id, "late")
    other = R.add_run(db, "smollm-cpu", "noise", BASE)
    assert R.fail_run(db, other, "slot 1 crashed").error == "slot 1 crashed"
    R.add_run(db, "qwen27b-h100", "phase0", BASE)
    assert [r.id for r in R.list_runs(db, "smollm-cpu")] == [run_id, other]
    assert [r.kind for r in R.list_runs(db, kind="phase0")] == ["phase0"]
    with pytest.raises(ValueError, match="run kind"):
        R.add_run(db, "smollm-cpu", "bogus", BASE)
    with pytest.raises(SpecPilotError, match="no run"):
        R.get_run(db, "missing")


def test_verdicts(memory):
    db = memory.db
    run_id = R.add_run(db, "smollm-cpu", "paired", BASE, CAND)
    stored = R.add_verdict(
        db,
        deployment="smollm-cpu",
        run_id=run_id,
        baseline_tree=BASE,
        candidate_tree=CAND,
        approved=True,
        changes_output=False,
        gain=1.052,
        lower_bound=1.031,
        sigma=0.004,
        threshold=1.018,
        unit="blocks",
        reasons=["clears 1% + 2σ"],
        evidence={"blocks": 5, "audit": {"mismatch_rate": 0.007}},
    )
    vid = stored.id
    v = R.get_verdict(db, vid)
    assert v == stored  # the record the controller holds is the record stored
    assert (v.approved, v.changes_output, v.unit, v.reasons) == (True, False, "blocks", ["clears 1% + 2σ"])
    assert v.evidence["audit"]["mismatch_rate"] == 0.007 and v.lower_bound == pytest.approx(1.031)
    assert [x.id for x in R.list_verdicts(db, "smollm-cpu")] == [vid]
    with pytest.raises(ValueError, match="unit"):
        fields = {k: x for k, x in vars(v).items() if k not in ("id", "created_at")}
        R.add_verdict(db, **{**fields, "unit": "seconds"})


def test_rounds_number_and_resume_state(memory):
    db = memory.db
    assert R.get_round(db, "smollm-cpu") is None
    r1 = R.start_round(db, "smollm-cpu")
    r2 = R.start_round(db, "smollm-cpu", state={"plan": "done"})
    other = R.start_round(db, "qwen27b-h100")
    assert (r1.number, r2.number, other.number) == (1, 2, 1)
    saved = R.save_round(db, "smollm-cpu", 2, {"plan": "done", "measured": ["d1"]}, status="judging")
    assert saved.status == "judging" and saved.updated_at >= saved.created_at
    latest = R.get_round(db, "smollm-cpu")
    assert (latest.number, latest.state) == (2, {"plan": "done", "measured": ["d1"]})
    assert R.get_round(db, "smollm-cpu", 1).state == {}
    assert [r.number for r in R.list_rounds(db, "smollm-cpu")] == [1, 2]
    with pytest.raises(SpecPilotError, match="no round 9"):
        R.save_round(db, "smollm-cpu", 9, {})


def test_deployment_state(memory):
    db = memory.db
    assert R.get_state(db, "smollm-cpu", "delta", default=0.5) == 0.5
    R.set_state(db, "smollm-cpu", "delta", 0.375)
    R.set_state(db, "smollm-cpu", "sigma", {"value": 0.004, "blocks": 5})
    R.set_state(db, "smollm-cpu", "delta", 0.25)
    assert R.get_state(db, "smollm-cpu", "delta") == 0.25
    assert R.all_state(db, "smollm-cpu") == {"delta": 0.25, "sigma": {"value": 0.004, "blocks": 5}}
    assert R.all_state(db, "other") == {}
