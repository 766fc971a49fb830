"""Paired runs: blocks with fresh processes, baseline A and candidate B on the same requests.

Three designs (`Deployment.design` picks one per deployment):
- **sliced** (CPU slots, one or more): on every core both systems are loaded and take turns of
  ~50 ms (slicer.py), so the host's drift in a core's speed hits both alike and cancels in their
  ratio; a request's time is the time its system ran. The measured requests are dealt across the
  cores at random, and each core's pair of processes is a block (d_i of stats.PairSpeeds); where
  they are batch groups (one per batch size), a round's cores together are one block.
- **swapped** (two slots): a block is two periods; in one, A runs on slot 0 and B on slot 1
  concurrently with the same request stream, in the other the slots are swapped, so a slot's own
  speed cancels (d_i of stats.RequestSpeeds). Which arrangement comes first is drawn per block.
- **interleaved** (one GPU slot): both systems are loaded on it, their processes on one host core
  drawn per block (placement.py), and take turns, the other frozen, a request at a time in ABBA order: X serves request 1, then Y, then Y serves
  request 2, then X, and so on (X, Y drawn once a comparison and swapped from block to block, so
  any two blocks hold both orders, which checks.carryover needs). Each system serves each request once per
  process, so nothing it keeps from one turn helps it in another; a request's two runs are one
  request apart, and a drift in the device's speed cancels pair by pair (d_i of stats.PairSpeeds).
  (Turns of half the requests each left a request's runs ~0.6 s apart on an H200, and the speed
  moved by up to 10% over that. A GPU cannot be sliced: freezing a process leaves its queued
  kernels running.)
Warm-up requests are served first and discarded. Every timestamp is the controller's; every line
is written to the raw file. What each system did besides answering (its CPU time, how long it took
to be ready, other load on its core or GPU) is kept per turn (period.py) for the checks in checks.py.
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .engine import EngineAdapter, Group, Request
from .noise import block_unit
from .period import PeriodResult, Turn, run_period
from .placement import available_cores, keep_off, pair_cores
from .slicer import SLICE_S, Slicer
from .slots import Slot
from .stats import PairSpeeds, RequestSpeeds
from .systems import SystemTree


@dataclass
class PairedRun:
    design: str = "swapped"
    blocks: list[list] = field(default_factory=list)  # per block: RequestSpeeds or PairSpeeds per request
    outputs: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # label -> id -> tokens
    periods: list[PeriodResult] = field(default_factory=list)
    block_disturbances: list[list[str]] = field(default_factory=list)  # per block
    block_rounds: list[int] = field(default_factory=list)  # per block: its round (0: first serves)
    violations: list[str] = field(default_factory=list)  # what the systems did that they must not
    warmup_ids: set[str] = field(default_factory=set)  # the warm-up requests: served, never timed

    @property
    def disturbances(self) -> list[str]:
        return [d for b in self.block_disturbances for d in b]

    @property
    def own_costs(self) -> list[str]:
        return [c for p in self.periods for t in p.turns for c in t.own_costs]

    def changes_output(self) -> list[str]:
        """Request ids on which B's tokens differ from A's."""
        a, b = self.outputs.get("A", {}), self.outputs.get("B", {})
        return sorted(i for i in a if a[i] != b.get(i))


def own_labels(candidate: SystemTree, baseline: SystemTree) -> frozenset[str]:
    """The systems whose GPU power cap in their own turns is their own cost (gpu_load.py): both,
    where two different trees are compared; none in an A/A run, where a cap is a disturbance."""
    return frozenset({"A", "B"}) if candidate.tree != baseline.tree else frozenset()


def paired_run(
    adapter: EngineAdapter,
    baseline: SystemTree,
    candidate: SystemTree,
    slots: Sequence[Slot],
    requests: Sequence[Request],
    *,
    rounds: int,
    warmup: int,
    raw: Path,
    design: str,
    seed: int = 0,
    progress: Callable[[str], None] = lambda _: None,
    check_trees: Callable[[], None] = lambda: None,
    run: PairedRun | None = None,
) -> PairedRun:
    """Measure candidate B against baseline A for `rounds` more rounds (appended to `run` when
    given) in `design` (sliced, swapped or interleaved); every line of evidence goes to the JSONL
    file `raw`. `check_trees` runs around every period (it re-hashes the exports).

    A block (noise.block_unit) is the unit of inference, fresh processes serving the same requests
    under A and B: a round, or in the sliced design one per slot (batch groups excepted)."""
    trees = {"A": baseline, "B": candidate}
    own = own_labels(candidate, baseline)
    warm, measured = list(requests[:warmup]), list(requests[warmup:])
    if not measured:
        raise ValueError("no requests left after the warm-up")
    order = tuple(random.Random(f"{seed}:order").sample(["A", "B"], 2))  # interleaved: X, Y of even blocks
    serve = {"sliced": _sliced_round, "swapped": _swapped_round,
             "interleaved": functools.partial(_interleaved_round, order=order)}[design]  # fmt: skip
    run = run or PairedRun(design=design)
    run.warmup_ids |= {r.id for r in warm}
    raw.parent.mkdir(parents=True, exist_ok=True)
    logs = raw.with_suffix("")
    per_slot = block_unit(design, any(isinstance(r, Group) for r in measured)) == "slot"
    with open(raw, "a") as fh:
        for _ in range(rounds):
            b, round_no = len(run.blocks), (run.block_rounds[-1] + 1 if run.block_rounds else 0)
            rng = random.Random(f"{seed}:{b}")
            periods = serve(
                adapter, trees, list(slots), warm, measured, logs, b, rng, progress, check_trees, own
            )
            check_trees()
            blocks = [[p] for p in periods] if per_slot else [periods]
            for i, block in enumerate(blocks):
                for p, period in enumerate(block):
                    _write_raw(fh, period, trees, b + i, p, {r.id for r in warm})
                served = [r for r in measured if any(r.id in p.results["A"] for p in block)]
                run.blocks.append(
                    _block_swapped(block, served, slots[0])
                    if design == "swapped"
                    else _block_pairs(block, served)
                )
                run.block_disturbances.append([d for p in block for d in p.disturbances])
                run.block_rounds.append(round_no)
            fh.flush()
            run.periods += periods
            run.violations += _record_outputs(run, periods, measured)
    return run


def _sliced_round(
    adapter, trees, slots, warm, measured, logs, b, rng, progress, check_trees, own
) -> list[PeriodResult]:
    """A block per slot, side by side: on every slot A and B at once, sharing its core in time
    slices (the phases aligned across slots; which system has a core first is the phase the slicer
    is in when both are ready); the measured requests dealt out at random, a part per slot, each
    after the warm-up."""
    dealt = rng.sample(measured, len(measured))
    parts = [dealt[i :: len(slots)] for i in range(len(slots))]
    progress(f"blocks {b + 1}-{b + len(slots)}: A and B sharing each of {', '.join(map(str, slots))} in turns "
             f"of ~{SLICE_S * 1e3:.0f} ms")  # fmt: skip
    for label, tree in trees.items():  # before the slots' threads, so no two prepare one cache
        adapter.prepare(tree.tree, tree.path, slots[0], logs / f"prepare-{label}-{tree.tree[:12]}.log", label)
    check_trees()
    periods: list[PeriodResult | None] = [None] * len(slots)
    errors: list[Exception] = []

    def serve(i: int, slot: Slot) -> None:
        try:
            periods[i] = run_period(adapter, trees, {"A": slot, "B": slot}, [{"A": warm + parts[i], "B": warm + parts[i]}],
                                    logs, f"b{b + i}", slicer, own)  # fmt: skip
        except Exception as e:  # re-raised below, in the caller's thread
            errors.append(e)

    with Slicer(["A", "B"]) as slicer:
        threads = [threading.Thread(target=serve, args=(i, s)) for i, s in enumerate(slots) if parts[i]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return [p for p in periods if p is not None]


def _swapped_round(
    adapter, trees, slots, warm, measured, logs, b, rng, progress, check_trees, own
) -> list[PeriodResult]:
    """Two periods, A and B concurrently on two slots, then swapped (which arrangement first: drawn)."""
    arrangements = [{"A": slots[0], "B": slots[1]}, {"A": slots[1], "B": slots[0]}]
    rng.shuffle(arrangements)
    periods = []
    for p, arr in enumerate(arrangements):
        progress(f"block {b + 1}, period {p + 1}/2: A on {arr['A']}, B on {arr['B']}")
        check_trees()
        both = [{"A": warm + measured, "B": warm + measured}]
        periods.append(run_period(adapter, trees, arr, both, logs, f"b{b}p{p}", own=own))
    return periods


def _interleaved_round(
    adapter, trees, slots, warm, measured, logs, b, rng, progress, check_trees, own, order
) -> list[PeriodResult]:
    """One period on one slot: both loaded, warm-up turns X, Y, then a turn per request in ABBA
    order — X r1, Y r1, Y r2, X r2, X r3, ... (X, Y: `order` in even blocks, swapped in odd ones)."""
    x, y = order if b % 2 == 0 else order[::-1]
    slot, keep = slots[0], contextlib.nullcontext()
    if slot.kind != "cpu":  # a GPU slot: both systems on one host core drawn for the block (placement.py)
        host, others = pair_cores(available_cores(), rng)
        slot, keep = replace(slot, host=host), keep_off(others)
    on = f" (host core {min(slot.host)})" if slot.host else ""
    progress(f"block {b + 1}: {x} and {y} taking turns on {slot}{on}, a request at a time")
    check_trees()
    with keep:
        schedule = interleaved_schedule(warm, measured, x, y)
        return [run_period(adapter, trees, {"A": slot, "B": slot}, schedule, logs, f"b{b}", own=own)]


def interleaved_schedule(warm: Sequence[Request], measured: Sequence[Request], x: str, y: str) -> list[Turn]:
    """Warm-up turns X, Y, then a turn per request in ABBA order: X r1, Y r1, Y r2, X r2, X r3, ..."""
    schedule: list[Turn] = [{x: list(warm)}, {y: list(warm)}] if warm else []
    for i, req in enumerate(measured):
        first, second = (x, y) if i % 2 == 0 else (y, x)
        schedule += [{first: [req]}, {second: [req]}]
    return schedule


def _write_raw(
    fh, period: PeriodResult, trees: dict[str, SystemTree], b: int, p: int, warm_ids: set[str]
) -> None:
    for label, res in period.results.items():
        for r in res.values():
            fh.write(json.dumps({
                "block": b, "period": p, "system": label, "tree": trees[label].tree, "slot": str(period.slots[label]),
                "id": r.id, "warmup": r.id in warm_ids, "t_send": r.t_send, "t_done": r.t_done, "active_s": r.active_s,
                "arrivals": r.arrivals,
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
            for req in (r for r in measured if r.id in res):  # a sliced block serves its slot's part
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


def _block_pairs(periods: list[PeriodResult], measured: Sequence[Request]) -> list[PairSpeeds]:
    """Each request's speed under A and B, from whichever period of the block served it."""
    speed = {(lb, rid): r.speed for p in periods for lb, res in p.results.items() for rid, r in res.items()}
    return [PairSpeeds(a=speed[("A", r.id)], b=speed[("B", r.id)]) for r in measured]
