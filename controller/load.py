"""Other load on a CPU slot's core while a period is measured.

A one-core slot is only a fair place to measure when the system on it has the core to itself. From
the kernel's per-core counters (/proc/stat) we take what the core spent busy during the measured
window, subtract the CPU time of the system pinned there and the controller's own CPU time in the
window (its request threads drive both systems alike, and on a machine with no spare core they
must run on the slot cores), and call the rest foreign: other processes (a build, a test run)
and time the hypervisor stole. A period whose foreign share passes `FOREIGN_SHARE_LIMIT` on any
slot is disturbed and its comparison gets no verdict (evaluate.py).

The counters tick at 100 Hz: a GPU turn (one request, 30-100 ms) reads one stray tick as 10-30%.
So a turn is held to the limit plus `RESOLUTION_S` (two ticks: busy and own time each read to a
tick), and the period to the limit over the sums of its turns (`summed`), where one turn's
rounding offsets another's and steady load in short turns still shows.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# A slot's core may spend this share of the measured window on anything but its system.
FOREIGN_SHARE_LIMIT = 0.10
_TICK = os.sysconf("SC_CLK_TCK")
RESOLUTION_S = 2 / _TICK  # a window's foreign time is known to about this


@dataclass(frozen=True)
class CoreTimes:
    busy_s: float  # user + nice + system + irq + softirq + steal
    steal_s: float
    irq_s: float = 0.0  # irq + softirq (in busy_s): interrupt work no process is charged for


def core_times(cores: list[int], stat: Path = Path("/proc/stat")) -> dict[int, CoreTimes]:
    """Cumulative busy and stolen seconds of each core in `cores` (absent cores are left out)."""
    out = {}
    for line in stat.read_text().splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        core = int(name[3:])
        if core in cores:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
            busy = user + nice + system + irq + softirq + steal
            out[core] = CoreTimes(busy / _TICK, steal / _TICK, (irq + softirq) / _TICK)
    return out


def foreign_load(
    before: CoreTimes, after: CoreTimes, own_cpu_s: float, wall_s: float, harness_s: float = 0.0
) -> dict[str, float]:
    """What a core did besides its system during a window of `wall_s` seconds. `harness_s`: the
    controller's own CPU time in the window, all threads, on whichever cores they ran; allowed on
    every slot core in full (we cannot tell which core ran it), so it is a bound, not a split."""
    busy = after.busy_s - before.busy_s
    foreign = max(0.0, busy - own_cpu_s - harness_s)
    return {
        "wall_s": wall_s,
        "busy_s": busy,
        "own_s": own_cpu_s,
        "harness_s": harness_s,
        "foreign_s": foreign,
        "steal_s": after.steal_s - before.steal_s,
        "irq_s": after.irq_s - before.irq_s,
        "foreign_share": foreign / wall_s if wall_s > 0 else 0.0,
        "disturbed": wall_s > 0 and foreign > FOREIGN_SHARE_LIMIT * wall_s + RESOLUTION_S,
    }


def summed(loads: list[dict]) -> dict[str, float]:
    """One core's load over many windows (a period's turns): the sums, foreign time from the
    unclipped sums, held to the limit with no slack."""
    tot = {
        k: sum(ld[k] for ld in loads) for k in ("wall_s", "busy_s", "own_s", "harness_s", "steal_s", "irq_s")
    }
    foreign = max(0.0, tot["busy_s"] - tot["own_s"] - tot["harness_s"])
    share = foreign / tot["wall_s"] if tot["wall_s"] > 0 else 0.0
    return tot | {"foreign_s": foreign, "foreign_share": share, "disturbed": share > FOREIGN_SHARE_LIMIT}


def over_turns(turn_loads: list[dict[str, dict]]) -> list[str]:
    """Each watched core's other load summed over a period's turns (each turn's records by label;
    two labels on one core share one record): one finding per core past the limit."""
    by_core: dict[int, dict[int, dict]] = {}
    for loads in turn_loads:
        for ld in loads.values():
            by_core.setdefault(ld["core"], {})[id(ld)] = ld
    out = []
    for core, loads in sorted(by_core.items()):
        if len(loads) > 1 and (s := summed(list(loads.values())))["disturbed"]:
            out.append(f"other load on cpu:{core}: {s['foreign_share']:.0%} of the period's turns went to "
                       "something besides the systems")  # fmt: skip
    return out


def summarize(items: list[str]) -> str:
    """Findings of the same kind once, with how often and the range of their figures:
    'other load on a slot: 22–88% of the turn went to something besides the system (8 times)'."""
    groups: dict[str, list[list[float]]] = {}
    for d in items:
        key = re.sub(r"\b(cpu|cuda):\d+\b", "a slot", d)
        key = re.sub(r"\bsystem [AB]\b", "the system", key)
        nums = [float(n) for n in re.findall(r"(\d+(?:\.\d+)?)%", key)]
        groups.setdefault(re.sub(r"\d+(?:\.\d+)?%", "{}%", key), []).append(nums)
    parts = []
    for key, figs in groups.items():
        text = key
        for i in range(key.count("{}%")):
            col = [f[i] for f in figs]
            lo, hi = min(col), max(col)
            text = text.replace("{}%", f"{lo:g}%" if lo == hi else f"{lo:g}–{hi:g}%", 1)
        parts.append(text + (f" ({len(figs)} times)" if len(figs) > 1 else ""))
    return "; ".join(parts)
