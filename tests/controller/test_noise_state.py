"""σ belongs to the design, slot count and block unit it was measured in: a comparison in another is
refused, and A/A runs pool only with runs of the same three."""

from __future__ import annotations

import pytest

from specpilot.controller.noise import noise_key, noise_state, pooled_noise
from specpilot.controller.stats import pooled_sd
from specpilot.deployments import Home, SpecPilotError, load_deployment
from specpilot.memory_store import connect, records


def test_noise_of_another_design_slot_count_or_block_unit_is_refused(tmp_path):
    db = connect(Home(tmp_path / "home"))
    dep = load_deployment("smollm-cpu")
    here = noise_key(dep)
    assert here == {"design": "sliced", "slots": 2, "block_unit": "slot"}
    figures = {"runs": [here | {"run_id": "r", "block_logs": [0.0, 0.01]}], "pooled_sd": 0.01, "sigma": 0.005}
    records.set_state(db, dep.name, "noise", figures | here)
    assert noise_state(db, dep)["design"] == dep.design
    other = "swapped" if dep.design != "swapped" else "sliced"
    recorded_before_units = {k: v for k, v in here.items() if k != "block_unit"}
    for then in (
        {**here, "design": other},
        {**here, "slots": here["slots"] + 1},
        {**here, "block_unit": "round"},
    ):
        records.set_state(db, dep.name, "noise", figures | then)
        with pytest.raises(SpecPilotError, match="controller noise --deployment smollm-cpu"):
            noise_state(db, dep)
    state = figures | recorded_before_units
    records.set_state(db, dep.name, "noise", state)
    with pytest.raises(SpecPilotError, match="the unit before it was recorded"):
        noise_state(db, dep)


def test_a_batch_deployment_judges_whole_rounds():
    assert noise_key(load_deployment("smollm-cpu-batch"))["block_unit"] == "round"
    assert noise_key(load_deployment("smollm-h200"))["block_unit"] == "round"


def test_runs_pool_only_with_runs_of_the_same_design_slots_and_unit():
    key = {"design": "sliced", "slots": 2, "block_unit": "round"}
    same = [key | {"block_logs": [0.01, -0.01, 0.02]}, key | {"block_logs": [0.0, 0.005]}]
    others = [
        key | {"block_unit": "slot", "block_logs": [0.3, -0.3]},  # per-core blocks of the same deployment
        {"design": "sliced", "slots": 2, "block_logs": [0.2, -0.2]},  # recorded before the unit was kept
        key | {"slots": 1, "block_logs": [0.1, -0.1]},
        key | {"design": "interleaved", "block_logs": [0.4, 0.0]},
    ]
    sd, df = pooled_noise(others[:2] + same + others[2:], key)
    assert (sd, df) == pooled_sd([r["block_logs"] for r in same])
    assert df == 3 and 0 < sd < 0.02
    assert pooled_noise(others[1:2], key) == pooled_sd([])
