"""A deployment's held-out prompts in the controller's records (why: deployments/workloads/held_out.py).

They live in the database (state `held_out`): no agent may read it (Home.records), no judged
system sees it (the jail hides the home), and every node of a Ray cluster draws from the same
ones. Adding or removing them clears Phase 0 and the stock noise, which were measured on other
prompts: the next round (or `specpilot phase0`) measures them again on what will be judged.
"""

from __future__ import annotations

from pathlib import Path

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.deployments.workloads import Prompt, held_out
from specpilot.memory_store import connect, records

KEY = "held_out"
# States measured on the judged prompts: Phase 0, the stock noise, the baselines' speed records
# (keyed by pool id, which a new set may give to another prompt).
MEASURED_ON_THE_POOL = ("phase0", "noise", "speeds")


def store(dep: Deployment, home: Home, source: Path) -> dict[str, int]:
    """Check `source` (JSONL, held_out.parse) and make it the deployment's held-out prompts in one
    write (after clearing what was measured on the prompts before); returns prompts per set."""
    try:
        text = Path(source).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecPilotError(f"{source}: cannot read the held-out prompts ({e}); give a JSONL file") from None
    prompts = held_out.parse(dep, text, str(source))
    got = held_out.counts(prompts)
    short = [f"{s}: {got.get(s, 0)} of {n}" for s, n in dep.draw_sizes.items() if got.get(s, 0) < n]
    need = sum(dep.draw_sizes.values()) + dep.controller.warmup_requests
    if short or len(prompts) < need:
        raise SpecPilotError(
            f"{source}: too few held-out prompts for one draw ({', '.join(short) or f'{len(prompts)} of {need} in all'}: "
            f"each set as many as the workload samples, and {dep.controller.warmup_requests} more for the "
            f"warm-up); add prompts or lower workload.sets"
        )
    db = connect(home)
    for key in MEASURED_ON_THE_POOL:  # first: cut short after it, the old prompts are measured again
        records.set_state(db, dep.name, key, None)
    records.set_state(db, dep.name, KEY, {"prompts": held_out.to_rows(prompts)})
    return got


def clear(dep: Deployment, home: Home) -> bool:
    """Judge on the public sets again; False where there were none."""
    db = connect(home)
    if records.get_state(db, dep.name, KEY) is None:
        return False
    for key in MEASURED_ON_THE_POOL:
        records.set_state(db, dep.name, key, None)
    records.set_state(db, dep.name, KEY, None)
    return True


def load(dep: Deployment, home: Home) -> list[Prompt] | None:
    """The deployment's held-out prompts, or None: its draws come from the public sets."""
    got = records.get_state(connect(home), dep.name, KEY)
    return None if got is None else held_out.from_rows(dep, got["prompts"])
