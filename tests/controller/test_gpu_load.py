"""The GPU load check's findings (controller/gpu_load.py): which throttles are a disturbance and
which are the candidate's own cost, and the settle before a turn; and the turn clocks of the two
systems (checks.clock_split).

CI has no GPU, so `GpuWatch` reads a stand-in NVML here: the `pynvml` calls it makes, answered from
a script of throttle masks (NVML's own bit values)."""

from __future__ import annotations

import sys
import types

import pytest

from specpilot.controller.checks import clock_split, violations
from specpilot.controller.gpu_load import POWER_CAP, GpuReport, GpuWatch
from specpilot.controller.paired import PairedRun
from specpilot.controller.period import PeriodResult, TurnStats
from specpilot.controller.slots import Slot

SW_POWER_CAP, SW_THERMAL, GPU_IDLE = 0x4, 0x20, 0x1  # nvmlClocksThrottleReason* bits


def test_a_power_cap_in_the_candidates_turn_is_its_own_cost():
    capped = GpuReport(sm_mhz=[1980, 1650, 1410], throttle={POWER_CAP})
    assert capped.disturbances("cuda:0", own=True) == []
    assert capped.power_capped
    # The same turn of the baseline (or of either system in an A/A run): the cap and the clock it moved.
    assert capped.disturbances("cuda:0") == [
        "cuda:0 throttled (software power cap)",
        "cuda:0's SM clock moved from 1980 to 1410 MHz",
    ]


def test_heat_other_processes_and_an_unexplained_clock_stay_disturbances_in_the_candidates_turn():
    hot = GpuReport(sm_mhz=[1980, 1980], throttle={POWER_CAP, "software thermal slowdown"}, others={4242})
    assert hot.disturbances("cuda:0", own=True) == [
        "other processes used cuda:0: pids 4242",
        "cuda:0 throttled (software thermal slowdown)",
    ]
    moved = GpuReport(sm_mhz=[1980, 1200])  # no cap of its own to explain it
    assert moved.disturbances("cuda:0", own=True) == ["cuda:0's SM clock moved from 1980 to 1200 MHz"]
    assert not moved.power_capped


class _Nvml(types.ModuleType):
    """The pynvml calls GpuWatch makes, answering throttle masks from `masks` (the last one repeats)."""

    NVML_CLOCK_SM = 1

    def __init__(self, masks: list[int]):
        super().__init__("pynvml")
        self.masks, self.polls = list(masks), 0

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return ("gpu", index)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle) -> int:
        self.polls += 1
        return self.masks.pop(0) if len(self.masks) > 1 else self.masks[0]

    def nvmlDeviceGetClockInfo(self, handle, clock: int) -> int:
        return 1980

    def nvmlDeviceGetComputeRunningProcesses(self, handle) -> list:
        return []


@pytest.fixture
def nvml(monkeypatch):
    def make(masks: list[int]) -> _Nvml:
        module = _Nvml(masks)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return make


def test_settle_waits_until_the_last_turns_cap_is_gone(nvml):
    fake = nvml([SW_POWER_CAP] * 5 + [GPU_IDLE])  # idle is no slowdown
    watch = GpuWatch(0)
    watch.settle(limit_s=60.0)
    assert fake.polls == 6  # out of the cap at the sixth query, long before the limit
    watch.settle()
    assert fake.polls == 7  # nothing to wait for: one query


def test_settle_gives_up_and_leaves_a_lasting_throttle_to_the_turns_samples(nvml):
    fake = nvml([SW_THERMAL])
    watch = GpuWatch(0)
    watch.settle(limit_s=0.05)
    assert fake.polls > 1  # it waited, polling, and then gave up
    watch.start(set())
    report = watch.stop()
    assert report.throttle == {"software thermal slowdown"} and report.sm_mhz[0] == 1980
    assert report.disturbances("cuda:0", own=True) == ["cuda:0 throttled (software thermal slowdown)"]


def _clocked(a_mhz: list[int], b_mhz: list[int]) -> PairedRun:
    """An interleaved run whose turns' watches saw these highest SM clocks, A's and B's in turn."""
    turns = [TurnStats([lb], 0.1, {lb: 0.1}, {lb: 0.1}, gpu={lb: {"sm_mhz_min": mhz - 15, "sm_mhz_max": mhz}})
             for a, b in zip(a_mhz, b_mhz, strict=True) for lb, mhz in (("A", a), ("B", b))]  # fmt: skip
    slot = Slot.parse("cuda:0")
    return PairedRun(
        design="interleaved", periods=[PeriodResult({"A": {}, "B": {}}, {"A": slot, "B": slot}, {}, turns)]
    )


def test_a_gpu_slowed_in_the_baselines_turns_is_a_violation():
    """Clocks lowered as the candidate's turn ends and raised as its next begins (as root, through
    NVML's locked clocks) show no throttle reason; the turn clocks show it."""
    [finding] = clock_split(_clocked([1410, 1410, 1425, 1980], [1980, 1980, 1980, 1965]))
    assert finding.startswith(
        "the GPU ran at 1418 MHz in the baseline's turns against 1980 MHz in the candidate's"
    )
    run = _clocked([1410, 1410, 1425, 1980], [1980, 1980, 1980, 1965])
    assert finding in violations(run)  # evaluate.py makes it an integrity reason


def test_even_clocks_or_the_candidate_under_its_own_cap_are_no_finding():
    assert clock_split(_clocked([1980, 1965, 1980], [1980, 1980, 1950])) == []
    assert clock_split(_clocked([1980] * 3, [1650, 1590, 1710])) == []  # B slower: its own cost
    cpu = PairedRun(design="sliced", periods=[PeriodResult({"A": {}, "B": {}}, {}, {}, [])])
    assert clock_split(cpu) == []
