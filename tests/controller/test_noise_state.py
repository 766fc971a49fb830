"""σ belongs to the design and slot count it was measured in: a comparison in another is refused."""

from __future__ import annotations

import pytest

from specpilot.controller.evaluate import noise_state
from specpilot.deployments import Home, SpecPilotError, load_deployment
from specpilot.memory_store import connect, records


def test_noise_of_another_design_or_slot_count_is_refused(tmp_path):
    db = connect(Home(tmp_path / "home"))
    dep = load_deployment("smollm-cpu")
    here = {"design": dep.design, "slots": len(dep.devices.slots)}
    figures = {"runs": [here | {"run_id": "r", "block_logs": [0.0, 0.01]}], "pooled_sd": 0.01, "sigma": 0.005}
    records.set_state(db, dep.name, "noise", figures | here)
    assert noise_state(db, dep)["design"] == dep.design
    other = "swapped" if dep.design != "swapped" else "sliced"
    for then in ({**here, "design": other}, {**here, "slots": here["slots"] + 1}):
        records.set_state(db, dep.name, "noise", figures | then)
        with pytest.raises(SpecPilotError, match="controller noise --deployment smollm-cpu"):
            noise_state(db, dep)
