"""Paired runs: blocks of two periods, fresh processes, baseline and candidate side by side.

Period 1 runs A on one slot and B on the other, concurrently, with the same request stream; period 2
swaps the slots. Which arrangement comes first is drawn at random per block. Warm-up requests are
served and discarded. Every timestamp is the controller's; every line is written to the raw file.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .engine import EngineAdapter, Request, RequestResult, SystemFailed
from .load import FOREIGN_SHARE_LIMIT, core_times, foreign_load
from .slots import Slot
from .stats import RequestSpeeds
from .systems import SystemTree

# A request may take this long per new token (plus a fixed allowance) before the system is hung.
SECONDS_PER_TOKEN_LIMIT = 2.0
# A system may use this many CPU seconds per wall second on a one-core slot before it is flagged.
CPU_SHARE_LIMIT = 1.15


@dataclass
class PeriodResult:
    results: dict[str, dict[str, RequestResult]]  # system label -> request id -> result
    slots: dict[str, Slot]  # system label -> slot
    usage: dict[str, dict]  # system label -> cpu/wall/cores
    load: dict[str, dict] = field(default_factory=dict)  # system label -> its CPU core's foreign load


@dataclass
class PairedRun:
    blocks: list[list[RequestSpeeds]] = field(default_factory=list)
    outputs: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # label -> id -> tokens
    violations: list[str] = field(default_factory=list)  # what the systems did that they must not
    disturbances: list[str] = field(default_factory=list)  # what else ran on the slots meanwhile
    periods: int = 0

    def changes_output(self) -> list[str]:
        """Request ids on which B's tokens differ from A's."""
        a, b = self.outputs.get("A", {}), self.outputs.get("B", {})
        return sorted(i for i in a if a[i] != b.get(i))


def _drive(system, requests: Sequence[Request], out: dict, errors: list, start: threading.Barrier) -> None:
    try:
        start.wait()
        for req in requests:
            out[req.id] = system.run(req, timeout_s=30.0 + SECONDS_PER_TOKEN_LIMIT * req.max_new_tokens)
    except (SystemFailed, threading.BrokenBarrierError) as e:
        errors.append(e)
        start.abort()


def run_period(
    adapter: EngineAdapter,
    trees: dict[str, SystemTree],
    slots: dict[str, Slot],
    requests: Sequence[Request],
    logs: Path,
    tag: str,
) -> PeriodResult:
    """Start every system fresh on its slot, serve the same requests concurrently, stop them all."""
    systems: dict = {}
    try:
        for label, tree in trees.items():
            systems[label] = adapter.start(
                tree.path, slots[label], logs / f"{tag}-{label}-{slots[label].kind}{slots[label].index}.log"
            )
        for system in systems.values():
            system.wait_ready()
        results: dict[str, dict[str, RequestResult]] = {label: {} for label in systems}
        errors: list[Exception] = []
        start = threading.Barrier(len(systems))
        threads = [threading.Thread(target=_drive, args=(systems[lb], requests, results[lb], errors, start))
                   for lb in systems]  # fmt: skip
        cores = {label: slots[label].index for label in systems if slots[label].kind == "cpu"}
        t0, cores0 = time.perf_counter(), core_times(list(cores.values()))
        own0 = {label: systems[label].usage()["cpu_s"] for label in cores}
        harness0 = time.process_time()  # this process: the request threads that drive both systems
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        usage = {label: s.usage() for label, s in systems.items()}
        wall, cores1 = time.perf_counter() - t0, core_times(list(cores.values()))
        harness = time.process_time() - harness0
        load = {label: foreign_load(cores0[c], cores1[c], usage[label]["cpu_s"] - own0[label], wall, harness)
                for label, c in cores.items() if c in cores0 and c in cores1}  # fmt: skip
        return PeriodResult(results, dict(slots), usage, load)
    finally:
        for system in systems.values():
            system.stop()


def _check_usage(period: PeriodResult) -> list[str]:
    """One-core slots: a system that widened its affinity or burned more than one core is flagged."""
    found = []
    for label, u in period.usage.items():
        slot = period.slots[label]
        if slot.kind != "cpu":
            continue
        if u.get("cores") not in (None, str(slot.index)):
            found.append(f"system {label} changed its CPU affinity on {slot} to {u['cores']}")
        if u["wall_s"] > 5 and u["cpu_s"] > CPU_SHARE_LIMIT * u["wall_s"]:
            found.append(f"system {label} used {u['cpu_s']:.1f} CPU-s in {u['wall_s']:.1f} s on one core")
    return found


def _check_load(period: PeriodResult) -> list[str]:
    """A slot whose core spent more than the limit on anything but its system disturbed the period."""
    return [
        f"other load on {period.slots[label]}: {ld['foreign_s']:.1f} of {ld['wall_s']:.1f} s "
        f"({ld['foreign_share']:.0%}, {ld['steal_s']:.1f} s stolen by the hypervisor) went to something "
        f"besides system {label}"
        for label, ld in period.load.items()
        if ld["foreign_share"] > FOREIGN_SHARE_LIMIT
    ]


def paired_run(
    adapter: EngineAdapter,
    baseline: SystemTree,
    candidate: SystemTree,
    slots: tuple[Slot, Slot],
    requests: Sequence[Request],
    *,
    blocks: int,
    warmup: int,
    raw: Path,
    seed: int = 0,
    progress: Callable[[str], None] = lambda _: None,
) -> PairedRun:
    """Measure candidate B against baseline A; every line of evidence goes to the JSONL file `raw`."""
    rng = random.Random(seed)
    trees = {"A": baseline, "B": candidate}
    s0, s1 = slots
    measured = list(requests[warmup:])
    if not measured:
        raise ValueError("no requests left after the warm-up")
    run = PairedRun()
    raw.parent.mkdir(parents=True, exist_ok=True)
    logs = raw.with_suffix("")
    with open(raw, "a") as fh:
        for b in range(blocks):
            arrangements = [{"A": s0, "B": s1}, {"A": s1, "B": s0}]
            rng.shuffle(arrangements)
            periods = []
            for p, arrangement in enumerate(arrangements):
                progress(
                    f"block {b + 1}/{blocks}, period {p + 1}/2: A on {arrangement['A']}, B on {arrangement['B']}"
                )
                period = run_period(adapter, trees, arrangement, requests, logs, f"b{b}p{p}")
                run.violations += _check_usage(period)
                run.disturbances += _check_load(period)
                run.periods += 1
                for label, res in period.results.items():
                    for req in requests:
                        r = res[req.id]
                        fh.write(json.dumps({
                            "block": b, "period": p, "system": label, "tree": trees[label].tree,
                            "slot": str(arrangement[label]), "id": r.id, "warmup": req not in measured,
                            "t_send": r.t_send, "t_done": r.t_done, "arrivals": r.arrivals,
                            "tokens": r.tokens, "claims": r.claims, "usage": period.usage[label],
                            "load": period.load.get(label),
                        }) + "\n")  # fmt: skip
                fh.flush()
                periods.append(period)
            run.blocks.append(_block_speeds(periods, measured, s0))
            run.violations += _record_outputs(run, periods, measured)
    return run


def _record_outputs(run: PairedRun, periods: list[PeriodResult], measured: Sequence[Request]) -> list[str]:
    """Keep each system's tokens; a system whose tokens change between periods is flagged."""
    found = []
    for period in periods:
        for label, res in period.results.items():
            seen = run.outputs.setdefault(label, {})
            for req in measured:
                tokens = res[req.id].tokens
                if seen.setdefault(req.id, tokens) != tokens:
                    found.append(
                        f"system {label} is not deterministic: request {req.id} changed between periods"
                    )
    return found


def _block_speeds(periods: list[PeriodResult], measured: Sequence[Request], s0: Slot) -> list[RequestSpeeds]:
    speed: dict[tuple[str, str, str], float] = {}
    for period in periods:
        for label, res in period.results.items():
            slot = "s0" if period.slots[label] == s0 else "s1"
            for req in measured:
                speed[(label, slot, req.id)] = res[req.id].speed
    return [
        RequestSpeeds(a_s0=speed[("A", "s0", r.id)], a_s1=speed[("A", "s1", r.id)],
                      b_s0=speed[("B", "s0", r.id)], b_s1=speed[("B", "s1", r.id)])
        for r in measured
    ]  # fmt: skip
