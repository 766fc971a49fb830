"""Paired runs: blocks with fresh processes, baseline A and candidate B on the same requests.

Two designs, by the number of device slots:
- **swapped** (two slots): a block is two periods; in one, A runs on slot 0 and B on slot 1
  concurrently with the same request stream, in the other the slots are swapped, so a slot's own
  speed cancels (d_i of stats.RequestSpeeds). Which arrangement comes first is drawn per block.
- **interleaved** (one slot): both systems are loaded on it and take turns, one generating while the
  other is frozen, a request at a time in ABBA order: X serves request 1, then Y, then Y serves
  request 2, then X, and so on (X, Y drawn per block). Each system serves each request once per
  process, so nothing it keeps from one turn helps it in another; a request's two runs are one
  request apart, and a drift in the device's speed cancels pair by pair (d_i of stats.PairSpeeds).
  (Turns of half the requests each left a request's runs ~0.6 s apart on an H200, and the speed
  moved by up to 10% over that.)
Warm-up requests are served first and discarded. Every timestamp is the controller's; every line
is written to the raw file. What each system did besides answering (its CPU time, how long it took
to be ready, other load on its core or GPU) is kept per turn for the checks in checks.py.
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
from .gpu_load import watch_for
from .load import core_times, foreign_load
from .slots import Slot
from .stats import PairSpeeds, RequestSpeeds
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
    served_s: dict[str, float]  # from the turn's start to the label's last answer
    load: dict[str, dict] = field(default_factory=dict)
    gpu: dict[str, dict] = field(default_factory=dict)
    disturbances: list[str] = field(default_factory=list)


@dataclass
class PeriodResult:
    results: dict[str, dict[str, RequestResult]]  # system label -> request id -> result
    slots: dict[str, Slot]  # system label -> slot
    usage: dict[str, dict]  # system label -> cpu/wall/cores at the end, ready_s
    turns: list[TurnStats] = field(default_factory=list)

    @property
    def disturbances(self) -> list[str]:
        return [d for t in self.turns for d in t.disturbances]


@dataclass
class PairedRun:
    design: str = "swapped"
    blocks: list[list] = field(default_factory=list)  # per block: RequestSpeeds or PairSpeeds per request
    outputs: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # label -> id -> tokens
    periods: list[PeriodResult] = field(default_factory=list)
    block_disturbances: list[list[str]] = field(default_factory=list)  # per block
    violations: list[str] = field(default_factory=list)  # what the systems did that they must not

    @property
    def disturbances(self) -> list[str]:
        return [d for b in self.block_disturbances for d in b]

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


def _serve_turn(systems: dict, slots: dict[str, Slot], turn: Turn, results: dict) -> TurnStats:
    """Serve one turn (its labels concurrently, the others frozen) and measure what else happened."""
    labels = list(turn)
    for label, system in systems.items():
        system.pause(label not in turn)
    cores = {lb: slots[lb].index for lb in labels if slots[lb].kind == "cpu"}
    watches = {lb: w for lb in labels if (w := watch_for(slots[lb])) is not None}
    ours = {pid for s in systems.values() for pid in s.pids()}
    for w in watches.values():
        w.start(ours)
    errors: list[Exception] = []
    barrier = threading.Barrier(len(labels))
    threads = [threading.Thread(target=_drive, args=(systems[lb], turn[lb], results[lb], errors, barrier))
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
    if errors:
        raise errors[0]
    cpu = {lb: systems[lb].usage()["cpu_s"] - cpu0[lb] for lb in labels}
    served = {lb: max(r.t_done for r in (results[lb][q.id] for q in turn[lb])) - t0 for lb in labels}
    stats = TurnStats(labels, wall, cpu, served)
    for lb, c in cores.items():
        if c in cores0 and c in cores1:
            stats.load[lb] = ld = foreign_load(cores0[c], cores1[c], cpu[lb], wall, harness)
            if ld["disturbed"]:
                stats.disturbances.append(
                    f"other load on {slots[lb]}: {ld['foreign_share']:.0%} of the turn went to something besides "
                    f"system {lb}")  # fmt: skip
    for lb, report in gpu.items():
        stats.gpu[lb] = report.to_json()
        stats.disturbances += report.disturbances(str(slots[lb]))
    return stats


def run_period(
    adapter: EngineAdapter,
    trees: dict[str, SystemTree],
    slots: dict[str, Slot],
    schedule: Sequence[Turn],
    logs: Path,
    tag: str,
) -> PeriodResult:
    """Start every system fresh on its slot (after its one prepare run), serve the schedule's
    turns in order, stop them all. Labels of one turn run concurrently and need distinct slots."""
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
        turns = [_serve_turn(systems, slots, turn, results) for turn in schedule]
        usage = {label: s.usage() | {"ready_s": ready[label].get("_ready_s")} for label, s in systems.items()}
        return PeriodResult(results, dict(slots), usage, turns)
    finally:
        for system in systems.values():
            system.stop()


def paired_run(
    adapter: EngineAdapter,
    baseline: SystemTree,
    candidate: SystemTree,
    slots: Sequence[Slot],
    requests: Sequence[Request],
    *,
    blocks: int,
    warmup: int,
    raw: Path,
    seed: int = 0,
    progress: Callable[[str], None] = lambda _: None,
    check_trees: Callable[[], None] = lambda: None,
    run: PairedRun | None = None,
    lockstep: bool = False,
    splits: int = 1,
) -> PairedRun:
    """Measure candidate B against baseline A for `blocks` more blocks (appended to `run` when
    given); every line of evidence goes to the JSONL file `raw`. `check_trees` runs around every
    period (it re-hashes the exports). `lockstep` (swapped design): both systems start each
    request together and the next waits for both (False: each serves the stream at its own pace).
    `splits` (swapped design): the measured requests are cut into this many parts, each served in
    a swapped pair of periods of its own (more, shorter-lived processes per block)."""
    trees = {"A": baseline, "B": candidate}
    warm, measured = list(requests[:warmup]), list(requests[warmup:])
    if not measured:
        raise ValueError("no requests left after the warm-up")
    one_slot = len(set(slots)) == 1
    run = run or PairedRun(design="interleaved" if one_slot else "swapped")
    raw.parent.mkdir(parents=True, exist_ok=True)
    logs = raw.with_suffix("")
    with open(raw, "a") as fh:
        for _ in range(blocks):
            b = len(run.blocks)
            rng = random.Random(f"{seed}:{b}")
            if one_slot:
                periods = [
                    _interleaved_period(adapter, trees, slots[0], warm, measured, logs, b, rng, progress)
                ]
            else:
                periods = []
                parts = [measured[i::splits] for i in range(splits)]
                for part in parts:
                    arrangements = [{"A": slots[0], "B": slots[1]}, {"A": slots[1], "B": slots[0]}]
                    rng.shuffle(arrangements)
                    for arr in arrangements:
                        p = len(periods)
                        progress(
                            f"block {b + 1}, period {p + 1}/{2 * splits}: A on {arr['A']}, B on {arr['B']}"
                        )
                        check_trees()
                        schedule = (
                            [{"A": warm, "B": warm}] * bool(warm) + [{"A": [r], "B": [r]} for r in part]
                            if lockstep
                            else [{"A": warm + part, "B": warm + part}]
                        )
                        periods.append(run_period(adapter, trees, arr, schedule, logs, f"b{b}p{p}"))
            check_trees()
            for p, period in enumerate(periods):
                _write_raw(fh, period, trees, b, p, {r.id for r in warm})
            fh.flush()
            run.periods += periods
            run.blocks.append(
                _block_interleaved(periods[0], measured)
                if one_slot
                else _block_swapped(periods, measured, slots[0])
            )
            run.block_disturbances.append([d for p in periods for d in p.disturbances])
            run.violations += _record_outputs(run, periods, measured)
    return run


def _interleaved_period(adapter, trees, slot, warm, measured, logs, b, rng, progress) -> PeriodResult:
    """One block of the one-slot design: both loaded, warm-up turns X, Y, then a turn per request
    in ABBA order — X r1, Y r1, Y r2, X r2, X r3, ... (X, Y drawn)."""
    x, y = rng.sample(["A", "B"], 2)
    progress(f"block {b + 1}: {x} and {y} taking turns on {slot}, a request at a time")
    schedule: list[Turn] = [{x: warm}, {y: warm}] if warm else []
    for i, req in enumerate(measured):
        first, second = (x, y) if i % 2 == 0 else (y, x)
        schedule += [{first: [req]}, {second: [req]}]
    return run_period(adapter, trees, {"A": slot, "B": slot}, schedule, logs, f"b{b}")


def _write_raw(
    fh, period: PeriodResult, trees: dict[str, SystemTree], b: int, p: int, warm_ids: set[str]
) -> None:
    for label, res in period.results.items():
        for r in res.values():
            fh.write(json.dumps({
                "block": b, "period": p, "system": label, "tree": trees[label].tree, "slot": str(period.slots[label]),
                "id": r.id, "warmup": r.id in warm_ids, "t_send": r.t_send, "t_done": r.t_done, "arrivals": r.arrivals,
                "tokens": r.tokens, "claims": r.claims, "usage": period.usage[label],
            }) + "\n")  # fmt: skip
    fh.write(
        json.dumps({"block": b, "period": p, "turns": [vars(t) for t in period.turns]}, default=list) + "\n"
    )


def _record_outputs(run: PairedRun, periods: list[PeriodResult], measured: Sequence[Request]) -> list[str]:
    """Keep each system's tokens; a system whose tokens change between periods is flagged."""
    found = []
    for period in periods:
        for label, res in period.results.items():
            seen = run.outputs.setdefault(label, {})
            for req in (r for r in measured if r.id in res):  # a period of a split block serves a part
                tokens = res[req.id].tokens
                if seen.setdefault(req.id, tokens) != tokens:
                    found.append(
                        f"system {label} is not deterministic: request {req.id} changed between periods"
                    )
    return found


def _block_swapped(periods: list[PeriodResult], measured: Sequence[Request], s0: Slot) -> list[RequestSpeeds]:
    speed: dict[tuple[str, str, str], float] = {}
    for period in periods:
        for label, res in period.results.items():
            slot = "s0" if period.slots[label] == s0 else "s1"
            for req in (r for r in measured if r.id in res):
                speed[(label, slot, req.id)] = res[req.id].speed
    return [
        RequestSpeeds(a_s0=speed[("A", "s0", r.id)], a_s1=speed[("A", "s1", r.id)],
                      b_s0=speed[("B", "s0", r.id)], b_s1=speed[("B", "s1", r.id)])
        for r in measured
    ]  # fmt: skip


def _block_interleaved(period: PeriodResult, measured: Sequence[Request]) -> list[PairSpeeds]:
    a, b = period.results["A"], period.results["B"]
    return [PairSpeeds(a=a[r.id].speed, b=b[r.id].speed) for r in measured]
