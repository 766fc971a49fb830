"""The slicer: two real processes on one core take turns, and each one's time is what it ran.

The systems here are real busy processes frozen and thawed by process-group signals (the
fallback `LineProcess.pause` uses where no cgroup is writable); what is tested is the slicer's
schedule and its accounting, against the kernel's own CPU-time figures.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from specpilot.controller.engine import SystemFailed
from specpilot.controller.period import _serve_turn
from specpilot.controller.slicer import Slicer, active
from specpilot.controller.slots import Slot

pytestmark = pytest.mark.quiet  # each process's CPU time against the slicer's turns


class Spinner:
    """A busy process pinned to one core, frozen by SIGSTOP to its group."""

    freezes_whole = False  # a process that left the group (setsid) would run on

    def __init__(self, core: int):
        code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
        self.proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        self.paused = False

    def pause(self, on: bool) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP if on else signal.SIGCONT)
        self.paused = on

    def cpu_s(self) -> float:
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def pair():
    a, b = Spinner(0), Spinner(0)
    time.sleep(0.3)  # both started and spinning
    yield {"A": a, "B": b}
    for s in (a, b):
        s.close()


def test_active_counts_only_the_time_inside_the_window():
    runs = [[0.0, 1.0], [2.0, 3.0], [4.0, float("inf")]]
    assert active(runs, 0.5, 2.5) == pytest.approx(1.0)
    assert active(runs, 1.0, 2.0) == 0.0
    assert active(runs, 0.0, 5.0) == pytest.approx(3.0)  # the open interval counts to the window's end
    assert active([], 0.0, 9.0) == 0.0


def test_two_processes_alternate_and_never_overlap(pair):
    cpu0 = {lb: s.cpu_s() for lb, s in pair.items()}
    with Slicer(["A", "B"], slice_s=0.05) as slicer:
        slicer.attach("cpu:0", pair)
        time.sleep(1.5)
        runs = slicer.detach("cpu:0")
    cpu = {lb: s.cpu_s() - cpu0[lb] for lb, s in pair.items()}
    assert all(s.paused for s in pair.values()), "detach leaves every system frozen"
    # Turns alternate A, B, A, ... and never overlap.
    merged = sorted((on, off, lb) for lb, rs in runs.items() for on, off in rs)
    order = "".join(lb for *_, lb in merged)
    assert order in ("AB" * len(order))[: len(order)] or order in ("BA" * len(order))[: len(order)], order
    assert all(prev[1] <= nxt[0] for prev, nxt in zip(merged, merged[1:], strict=False))
    # ~30 turns of 25..75 ms (a late slicer thread only makes turns longer, so fewer).
    assert 15 <= len(merged) <= 36, len(merged)
    given = {lb: active(rs, 0.0, time.perf_counter()) for lb, rs in runs.items()}
    # Each label's share is half, give or take its ~15 jittered turns (sd of a share ~3%): 7 sd.
    share = given["A"] / (given["A"] + given["B"])
    assert 0.3 <= share <= 0.7, given
    # The kernel agrees: each process computed only while the slicer let it (clock ticks: ±0.05 s).
    for lb in pair:
        assert cpu[lb] <= given[lb] + 0.05, (lb, cpu, given)
        assert cpu[lb] >= 0.6 * given[lb], (lb, cpu, given)


def test_a_finished_system_hands_the_core_to_the_other(pair):
    with Slicer(["A", "B"], slice_s=0.05) as slicer:
        slicer.attach("cpu:0", pair)
        time.sleep(0.3)
        slicer.finish("cpu:0", "A")
        t = time.perf_counter()
        time.sleep(0.5)
        runs = slicer.detach("cpu:0")
    assert active(runs["A"], t + 0.06, t + 0.5) == 0.0
    assert active(runs["B"], t + 0.06, t + 0.5) == pytest.approx(0.44, abs=0.02)


def test_a_system_that_cannot_be_frozen_whole_is_not_sliced(pair):
    """Process-group signals miss a helper that left the group: it would run in the other's turns."""
    slot = Slot("cpu", 0)
    with Slicer(["A", "B"]) as slicer, pytest.raises(SystemFailed, match="frozen whole"):
        _serve_turn(pair, {"A": slot, "B": slot}, {"A": [], "B": []}, {"A": {}, "B": {}}, slicer)
    assert not slicer.cores, "nothing was attached"
