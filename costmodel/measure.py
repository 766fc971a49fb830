"""One call for the round loop: the cost-model report of a system tree on a slot."""

from __future__ import annotations

import time
from pathlib import Path

from specpilot.deployments import Deployment, Home, SpecPilotError

from .decompose import CostReport, decompose, node_budget
from .devices import device_spec
from .profile import load_profile
from .recording import label_sets, load_records
from .replay import BUDGETS, replay_table
from .runner import Jail, cached_record, run_profile


def measure(
    dep: Deployment,
    home: Home,
    *,
    tree: Path | None = None,
    slot: str | None = None,
    requests: Path | None = None,
    system: str | None = None,
    profile: Path | None = None,
    record: Path | None = None,
    budget: int | None = None,
    max_requests: int | None = None,
    reprobe: bool = False,
    jail: Jail | None = None,
) -> CostReport:
    """Profile and record the system at `tree` on `slot` over `requests` (or read the given
    `profile` / `record` files), replay τ and decompose. The device's peaks come first: a CPU probe
    never runs beside the system. Profiles go to `<home>/runs/costmodel/`; recordings are cached.
    `jail`: the tools run confined (runner.py); the controller always gives one."""
    slot = slot or dep.devices.slots[0]
    if (profile is None or record is None) and (tree is None or requests is None):
        raise SpecPilotError(
            "the cost model needs a system tree and a request file, or --profile and --record"
        )
    device = device_spec(dep, home, refresh=reprobe)
    if profile is not None:
        prof = load_profile(profile)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = home.runs / "costmodel" / f"{dep.name}-{stamp}" / "profile.json"
        prof = run_profile(
            tree, slot, requests, out, home, max_requests=max_requests, model=dep.target.model, jail=jail
        )
    if record is not None:
        records = load_records(record)
    else:
        _, records = cached_record(tree, slot, requests, home, model=dep.target.model, jail=jail)
    records = label_sets(records, requests)
    want = budget or node_budget(prof)
    table = replay_table(records, sorted({*BUDGETS, want}))
    return decompose(prof, dep, device, table, budget=want, system=system)
