"""What a stock noise σ belongs to, and which A/A runs pool into it.

σ is a block's spread in one design, on so many slots, of one block unit: a slot's share of a
sliced round ("slot"), or a whole round ("round": a swapped or interleaved round, and a sliced round
of batch groups, whose cores each hold only some batch sizes). A comparison is judged only against
the σ of its own three, and A/A runs pool only with runs recorded under the same three.
"""

from __future__ import annotations

from typing import Any

from specpilot.deployments import Deployment, SpecPilotError
from specpilot.memory_store import records

from .stats import pooled_sd


def block_unit(design: str, grouped: bool) -> str:
    """What one block of a paired run is (paired.paired_run forms blocks so)."""
    return "slot" if design == "sliced" and not grouped else "round"


def noise_key(dep: Deployment) -> dict[str, Any]:
    """The design, slot count and block unit a σ of `dep` is measured in."""
    return {"design": dep.design, "slots": len(dep.devices.slots),
            "block_unit": block_unit(dep.design, dep.serving.shape == "batch")}  # fmt: skip


def pooled_noise(runs: list[dict], key: dict[str, Any]) -> tuple[float, int]:
    """The pooled block sd (and its degrees of freedom) of the A/A runs recorded under `key`; a run
    recorded before the block unit was kept pools with none of today's."""
    return pooled_sd([r["block_logs"] for r in runs if {k: r.get(k) for k in key} == key])


def noise_state(db, dep: Deployment) -> dict[str, Any]:
    """The deployment's stored noise record, refused where it was measured under another key."""
    noise = records.get_state(db, dep.name, "noise")
    if noise is None or "runs" not in noise:
        raise SpecPilotError(
            f"no stock noise for {dep.name!r} yet; run `specpilot phase0 --deployment {dep.name}` "
            f"(or `specpilot controller noise --deployment {dep.name}`) first"
        )
    here = noise_key(dep)
    then = {k: noise.get(k) for k in here}
    if then != here:
        raise SpecPilotError(
            f"the stock noise of {dep.name!r} was measured in the {then['design']} design on {then['slots']} slot(s) "
            f"with a block of one {then['block_unit'] or 'slot (the unit before it was recorded)'}; the deployment "
            f"now asks for {here['design']} on {here['slots']} with a block of one {here['block_unit']}: run `specpilot "
            f"controller noise --deployment {dep.name}` (or `specpilot phase0`) again first"
        )
    return noise
