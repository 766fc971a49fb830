"""A period: systems started fresh on their slots, a schedule of turns served, the systems stopped.

A turn is one or more systems serving their requests at once while every other system is frozen
(on a CPU slot shared in time slices: slicer.py). Per turn the controller keeps each system's CPU
seconds and serving window and what else used its slot: other load on its host core (load.py) and,
on a GPU slot, the GPU watch (gpu_load.py: other processes, throttling, the SM clock), before which
the GPU is let out of any throttle. Every design of paired.py, Phase 0 and the audit serve their
requests through `run_period`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .engine import EngineAdapter, Request, RequestResult, SystemFailed
from .gpu_load import watch_for
from .load import core_times, foreign_load, over_turns
from .slicer import Slicer, active
from .slots import Slot
from .systems import SystemTree

# A request may take this long per new token (plus a fixed allowance) before the system is hung.
SECONDS_PER_TOKEN_LIMIT = 2.0

Turn = dict[str, list[Request]]  # system label -> the requests it serves in this turn (labels concurrently)


@dataclass
class TurnStats:
    """What happened while a turn was served: per label its CPU seconds and serving window, and the
    other load on each slot it used (CPU: /proc/stat; GPU: NVML)."""

    labels: list[str]
    wall_s: float
    cpu_s: dict[str, float]
    served_s: dict[str, float]  # from the turn's start to the label's last answer (sliced: time it ran)
    load: dict[str, dict] = field(default_factory=dict)
    gpu: dict[str, dict] = field(default_factory=dict)
    disturbances: list[str] = field(default_factory=list)
    own_costs: list[str] = field(default_factory=list)  # a system's own throttling (gpu_load.py)


@dataclass
class PeriodResult:
    results: dict[str, dict[str, RequestResult]]  # system label -> request id -> result
    slots: dict[str, Slot]  # system label -> slot
    usage: dict[str, dict]  # system label -> cpu/wall/cores at the end, ready_s
    turns: list[TurnStats] = field(default_factory=list)

    @property
    def disturbances(self) -> list[str]:
        return [d for t in self.turns for d in t.disturbances] + over_turns([t.load for t in self.turns])


def _drive(system, requests: Sequence[Request], out: dict, errors: list, start: threading.Barrier,
           done: Callable[[], None]) -> None:  # fmt: skip
    try:
        start.wait()
        for req in requests:
            # A sliced system runs about half the wall time; the limit is generous either way.
            out[req.id] = system.run(req, timeout_s=30.0 + SECONDS_PER_TOKEN_LIMIT * req.max_new_tokens)
    except (SystemFailed, threading.BrokenBarrierError) as e:
        errors.append(e)
        start.abort()
    finally:
        done()


def _serve_turn(systems: dict, slots: dict[str, Slot], turn: Turn, results: dict,
                slicer: Slicer | None = None, own: frozenset[str] = frozenset(), drain: bool = False) -> TurnStats:  # fmt: skip
    """Serve one turn (its labels concurrently, the others frozen; with a `slicer`, the turn's
    labels share their core in time slices) and measure what else happened. `own`: the labels whose
    GPU power cap in their own turns is their own cost (paired.own_labels: both where two systems
    are compared, none in an A/A run). `drain`: the GPU passes to another system next, so wait
    (untimed) until the kernels of this turn's systems are done, and note how long they ran after
    the last answer (gpu_load.GpuWatch.drain)."""
    labels = list(turn)
    key = str(slots[labels[0]])
    if slicer is not None:
        for lb in labels:  # a process-group signal misses a process that left the group (setsid)
            if not systems[lb].freezes_whole:
                raise SystemFailed(
                    f"system {lb} cannot be frozen whole (no writable cgroup freezer here), so it cannot share "
                    "its core in time slices: run where /sys/fs/cgroup is writable, or set "
                    'controller.design = "swapped" in the deployment',
                    "",
                )
        slicer.attach(key, {lb: systems[lb] for lb in labels})
    else:
        for label, system in systems.items():
            system.pause(label not in turn)
    runs = None
    try:
        cores = {lb: min(c) for lb in labels if (c := slots[lb].host_cores())}  # the load check's
        watches = {lb: w for lb in labels if (w := watch_for(slots[lb])) is not None}
        for lb, w in watches.items():  # out of the last turn's throttle first, then watched
            w.settle()  # a GPU's own systems are those on its slot: one on another GPU is other load here
            w.start({pid for o, s in systems.items() if slots[o] == slots[lb] for pid in s.pids()})
        errors: list[Exception] = []
        barrier = threading.Barrier(len(labels))
        finish = (lambda lb: lambda: slicer.finish(key, lb)) if slicer else (lambda lb: lambda: None)
        threads = [threading.Thread(target=_drive, args=(systems[lb], turn[lb], results[lb], errors, barrier, finish(lb)))
                   for lb in labels]  # fmt: skip
        cpu0 = {lb: systems[lb].usage()["cpu_s"] for lb in labels}
        t0, cores0, harness0 = time.perf_counter(), core_times(list(cores.values())), time.process_time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall, cores1, harness = (
            time.perf_counter() - t0,
            core_times(list(cores.values())),
            time.process_time() - harness0,
        )
        gpu = {lb: w.stop() for lb, w in watches.items()}
        if drain:  # the answers' perf_counter times, on the wall clock NVML's samples use
            now, clock = time.perf_counter(), time.time()
            for lb, w in watches.items():
                done = max((r.t_done for r in results[lb].values()), default=now)
                gpu[lb].drained, gpu[lb].busy_after_answer_s = True, w.drain(clock - (now - done))
                gpu[lb].drain_s = time.perf_counter() - now
    finally:  # whatever failed, the core is the slicer's no more (every system left frozen)
        if slicer is not None:
            runs = slicer.detach(key)
    if errors:
        raise errors[0]
    cpu = {lb: systems[lb].usage()["cpu_s"] - cpu0[lb] for lb in labels}
    last = {lb: max(r.t_done for r in (results[lb][q.id] for q in turn[lb])) for lb in labels}
    if runs is None:
        served = {lb: last[lb] - t0 for lb in labels}
    else:  # a request's time, and a label's serving window, is the time its system ran
        for lb in labels:
            for q in turn[lb]:
                r = results[lb][q.id]
                r.active_s = active(runs[lb], r.t_send, r.t_done)
        served = {lb: active(runs[lb], t0, last[lb]) for lb in labels}
    stats = TurnStats(labels, wall, cpu, served)
    for c in set(cores.values()):
        on = [lb for lb in labels if cores.get(lb) == c]
        if c in cores0 and c in cores1:
            ld = foreign_load(cores0[c], cores1[c], sum(cpu[lb] for lb in on), wall, harness) | {"core": c}
            stats.load |= dict.fromkeys(on, ld)
            if ld["disturbed"]:
                who = " and ".join(on)
                stats.disturbances.append(
                    f"other load on cpu:{c}: {ld['foreign_share']:.0%} of the turn went to something besides "
                    f"system{'s' * (len(on) > 1)} {who}")  # fmt: skip
    for lb, report in gpu.items():
        stats.gpu[lb] = report.to_json()
        stats.disturbances += report.disturbances(str(slots[lb]), own=lb in own)
        if lb in own and report.power_capped:
            stats.own_costs.append(f"{slots[lb]} ran under its power cap in {lb}'s turns")
    return stats


def hands_over(schedule: Sequence[Turn]) -> list[bool]:
    """Per turn: whether the next turn is other systems' (there the GPU is drained after it; a
    system's own next turn pays for its own queued work)."""
    return [i + 1 < len(schedule) and set(schedule[i + 1]) != set(turn) for i, turn in enumerate(schedule)]


def run_period(
    adapter: EngineAdapter,
    trees: dict[str, SystemTree],
    slots: dict[str, Slot],
    schedule: Sequence[Turn],
    logs: Path,
    tag: str,
    slicer: Slicer | None = None,
    own: frozenset[str] = frozenset(),
) -> PeriodResult:
    """Start every system fresh on its slot (after its one prepare run), serve the schedule's
    turns in order, stop them all. Labels of one turn run concurrently and need distinct slots,
    or, with a `slicer`, share one CPU slot in time slices. `own`: as in _serve_turn."""
    for label, tree in trees.items():
        adapter.prepare(
            tree.tree, tree.path, slots[label], logs / f"prepare-{label}-{tree.tree[:12]}.log", label
        )
    systems: dict = {}
    try:
        for label, tree in trees.items():
            slot = slots[label]
            systems[label] = adapter.start(tree.tree, tree.path, slot, logs / f"{tag}-{label}-{slot.kind}{slot.index}.log",
                                           label)  # fmt: skip
        ready = {label: system.wait_ready() for label, system in systems.items()}
        results: dict[str, dict[str, RequestResult]] = {label: {} for label in systems}
        turns = [_serve_turn(systems, slots, turn, results, slicer, own, drain)
                 for turn, drain in zip(schedule, hands_over(schedule), strict=True)]  # fmt: skip
        usage = {}
        for label, s in systems.items():  # one at a time: the others stay frozen while one exits
            u = s.usage() | {
                "ready_s": ready[label].get("_ready_s"),
                "ready_cpu_s": ready[label].get("_ready_cpu_s"),
            }
            usage[label] = u | (s.stop() or {})
        return PeriodResult(results, dict(slots), usage, turns)
    finally:
        for system in systems.values():
            system.stop()
