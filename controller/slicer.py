"""Time slices: two systems on one CPU core, taking turns of a few milliseconds.

On a shared host a core's speed drifts by 10–25% over seconds (memory bandwidth and caches taken
by other guests), and that drift, not the systems, was most of a slot-swapped block's spread
(docs/BENCHMARKS.md). Systems that share a core and alternate every ~50 ms see the same drift, so
it cancels in their speed ratio. The slicer thaws one system per core and freezes the other,
flipping every `slice_s`; every core runs the same label (A everywhere, then B everywhere), so a
system is measured beside itself on the next core, not the other one (the cores flip one after
another, each after its freeze completed: a few ms apart, in the same order at every flip). What each
system was given is recorded as intervals on the controller's clock, and a request's time is the
time its system ran between sending and its last token (`active`): frozen time is nobody's.
A turn's length is drawn between half and one and a half `slice_s`, so a system cannot time the
end of its turn (to leave the core's caches spoiled for the other, say).

When one system has served everything on a core, it is frozen at once (not at its turn's end) and
the other keeps the core until it is done.
What runs on while a system is frozen — a sleep, a disk read — is not counted against it, so a
system that waits instead of computing is favoured; on a CPU slot that is no way to make tokens,
and the work check (checks.py) flags tokens made without compute.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

SLICE_S = 0.05


@dataclass
class _Core:
    systems: dict  # label -> RunningSystem (pause(on) freezes or thaws it)
    runs: dict[str, list[list[float]]] = field(default_factory=dict)  # label -> [[on, off], ...]
    done: set[str] = field(default_factory=set)
    running: str | None = None
    errors: list[Exception] = field(default_factory=list)  # freezes that failed on this core


class Slicer:
    """Alternates the systems of every attached core; one thread for all cores, so phases align."""

    def __init__(self, order: Iterable[str], slice_s: float = SLICE_S):
        """`order`: the labels, in the order their phases come."""
        self.order, self.slice_s = list(order), slice_s
        self.rng = random.SystemRandom()
        self.cores: dict[str, _Core] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> Slicer:
        self.thread = threading.Thread(target=self._loop, name="slicer", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()

    def attach(self, key: str, systems: dict) -> None:
        """Start slicing `systems` (label -> system, all on one core); each is frozen until its turn."""
        for s in systems.values():
            s.pause(True)
        with self.lock:
            self.cores[key] = _Core(dict(systems), {lb: [] for lb in systems})

    def finish(self, key: str, label: str) -> None:
        """`label` has served everything on `key`: the core goes to the other system now."""
        with self.lock:
            core = self.cores[key]
            core.done.add(label)
            if core.running == label:
                self._give(core, label)

    def detach(self, key: str) -> dict[str, list[list[float]]]:
        """Stop slicing `key` (every system left frozen); the intervals each label ran."""
        with self.lock:
            core = self.cores.pop(key)
            self._switch(core, None)
        if core.errors:
            raise core.errors[0]
        return core.runs

    def _loop(self) -> None:
        phase = 0
        while not self.stopped.is_set():
            with self.lock:
                for core in self.cores.values():
                    self._give(core, self.order[phase % len(self.order)])
            phase += 1
            self.stopped.wait(self.slice_s * self.rng.uniform(0.5, 1.5))

    def _give(self, core: _Core, want: str) -> None:
        """Run `want` on `core`, or the first label with work left if `want` has none."""
        if want in core.done or want not in core.systems:
            left = [lb for lb in self.order if lb in core.systems and lb not in core.done]
            want = left[0] if left else None
        try:
            self._switch(core, want)
        except OSError as e:  # the cgroup could not be frozen: the period fails
            core.errors.append(e)

    @staticmethod
    def _switch(core: _Core, want: str | None) -> None:
        """Freeze the running system (waiting until it is), then thaw `want`."""
        if core.running == want:
            return
        if core.running is not None:
            core.systems[core.running].pause(True)
            core.runs[core.running][-1][1] = time.perf_counter()
        core.running = want
        if want is not None:
            t = time.perf_counter()
            core.runs[want].append([t, float("inf")])
            core.systems[want].pause(False)


def active(runs: list[list[float]], t0: float, t1: float) -> float:
    """Seconds within [t0, t1] during which the system ran (an interval still open counts to t1)."""
    return sum(max(0.0, min(off, t1) - max(on, t0)) for on, off in runs)
