"""The round's state: a typed record that survives the database round trip, and refuses fields it
does not know (a state written by another version) with one clear error."""

from __future__ import annotations

import pytest

from specpilot.deployments import Home, SpecPilotError
from specpilot.memory_store import connect, records
from specpilot.orchestrator.roundview import Baseline, RoundState


def test_state_round_trips_through_the_rounds_table(tmp_path):
    db = connect(Home(tmp_path / "home"))
    st = RoundState("memory", Baseline("c0ffee", "7ree", ["refspec-knobs"]), rounds_left=2)
    st.finished.append("phase0")
    st.evaluations["0"] = {"approved": True, "gain": 1.04}
    rec = records.start_round(db, "smollm-cpu", st.to_json())
    back = RoundState.from_json(records.get_round(db, "smollm-cpu", rec.number).state)
    assert back == st and back.baseline.entries == ["refspec-knobs"] and back.rounds_left == 2


def test_unknown_or_missing_fields_are_one_clear_error():
    good = RoundState("memory", Baseline("c", "t", [])).to_json()
    with pytest.raises(SpecPilotError, match=r"\['surprise'\].*finish that round"):
        RoundState.from_json(good | {"surprise": 1})
    with pytest.raises(SpecPilotError, match="missing agent/baseline"):
        RoundState.from_json({k: v for k, v in good.items() if k != "baseline"})
