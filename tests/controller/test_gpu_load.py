"""The GPU load check's findings (controller/gpu_load.py): which throttles are a disturbance and
which are the candidate's own cost, and the settle before a turn; and the turn clocks of the two
systems (checks.clock_split).

CI has no GPU, so `GpuWatch` reads a stand-in NVML here: the `pynvml` calls it makes, answered from
a script of throttle masks (NVML's own bit values) and a timeline of utilization samples (NVML's
sample layout: a CPU time stamp in µs ending each sample's period, the busy percent in `uiVal`)."""

from __future__ import annotations

import sys
import time
import types

import pytest

from specpilot.controller.checks import clock_split, power_limit_moved, queued_past_answer, violations
from specpilot.controller.gpu_load import POWER_CAP, GpuReport, GpuWatch
from specpilot.controller.paired import PairedRun, own_labels
from specpilot.controller.period import PeriodResult, TurnStats, hands_over
from specpilot.controller.slots import Slot
from specpilot.controller.systems import SystemTree
from specpilot.deployments import SpecPilotError

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


class _NvmlError(Exception):
    pass


class _NotFound(_NvmlError):
    pass


class _Nvml(types.ModuleType):
    """The pynvml calls GpuWatch makes, answering throttle masks from `masks` (the last one repeats)
    and utilization samples every `period_us` of the wall clock, busy (100) where the sample's
    period overlaps `busy` (a wall-clock interval in µs)."""

    NVML_CLOCK_SM, NVML_GPU_UTILIZATION_SAMPLES = 1, 1
    NVMLError, NVMLError_NotFound = _NvmlError, _NotFound

    def __init__(self, masks: list[int]):
        super().__init__("pynvml")
        self.masks, self.polls = list(masks), 0
        self.period_us, self.busy, self.sampled = 20_000, (0, 0), True
        self.limit_mw = 700_000

    def nvmlDeviceGetSamples(self, handle, kind: int, after_us: int) -> tuple[int, list]:
        if not self.sampled:
            raise _NvmlError("Not Supported")
        now = time.time_ns() // 1000
        first = (after_us // self.period_us + 1) * self.period_us
        out = [
            types.SimpleNamespace(timeStamp=ts, sampleValue=types.SimpleNamespace(uiVal=100 * self._busy(ts)))
            for ts in range(first, now + 1, self.period_us)
        ]
        if not out:
            raise _NotFound()
        return 1, out

    def _busy(self, ts: int) -> bool:
        return ts - self.period_us < self.busy[1] and ts > self.busy[0]

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

    def nvmlDeviceGetEnforcedPowerLimit(self, handle) -> int:
        return self.limit_mw


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
    assert report.power_limit_w == {700} and report.to_json()["power_limit_w"] == [700]


def test_each_systems_cap_is_its_own_where_two_systems_are_compared_and_none_in_an_aa_run(tmp_path):
    """A baseline approved for a kernel that draws more power a byte (W12) caps itself in its own
    turns as it did as the candidate: its cost, not a disturbance that leaves no verdict."""
    stock, w12 = SystemTree("a" * 40, tmp_path / "a"), SystemTree("b" * 40, tmp_path / "b")
    assert own_labels(candidate=w12, baseline=stock) == {"A", "B"}
    assert own_labels(candidate=stock, baseline=w12) == {"A", "B"}
    assert own_labels(candidate=stock, baseline=SystemTree("a" * 40, tmp_path / "c")) == frozenset()
    capped = GpuReport(sm_mhz=[1980, 1500], throttle={POWER_CAP})
    assert capped.disturbances("cuda:0", own=True) == []
    assert capped.disturbances("cuda:0") == [
        "cuda:0 throttled (software power cap)",
        "cuda:0's SM clock moved from 1980 to 1500 MHz",
    ]


def _limited(a_w: list[int], b_w: list[int]) -> PairedRun:
    """An interleaved run whose turns read these enforced power limits, A's and B's in turn."""
    turns = [TurnStats([lb], 0.1, {lb: 0.1}, {lb: 0.1}, gpu={lb: {"sm_mhz_max": 1980, "power_limit_w": [w]}})
             for a, b in zip(a_w, b_w, strict=True) for lb, w in (("A", a), ("B", b))]  # fmt: skip
    slot = Slot.parse("cuda:0")
    return PairedRun(
        design="interleaved", periods=[PeriodResult({"A": {}, "B": {}}, {"A": slot, "B": slot}, {}, turns)]
    )


def test_a_power_limit_lowered_for_the_other_systems_turns_is_a_violation():
    """As root, a system could lower the limit as its turn ends and raise it as its next begins,
    so the other's cap (now counted as the other's own cost) would be of its making."""
    run = _limited([500, 500, 700], [700, 700, 700])
    [finding] = power_limit_moved(run)
    assert finding == (
        "the GPU's power limit moved during the run ([500, 700] W in A's turns; [700] W in B's turns): "
        "something set it between turns"
    )
    assert finding in violations(run)
    assert power_limit_moved(_limited([600] * 3, [600] * 3)) == []  # one limit, whatever its value


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


def test_drain_waits_for_an_idle_sample_that_lies_wholly_after_the_answer(nvml):
    fake = nvml([GPU_IDLE])
    watch = GpuWatch(0)
    answer = time.time()
    a_us = int(answer * 1e6)
    fake.busy = (a_us - 50_000, a_us)  # the turn's own work, up to its answer: in the straddling sample only
    t0 = time.perf_counter()
    assert watch.drain(answer) == 0.0
    assert time.perf_counter() - t0 >= 0.02  # it waited for a sample past the straddling one


def test_drain_names_kernels_queued_past_the_answer_and_waits_them_out(nvml):
    fake = nvml([GPU_IDLE])
    watch = GpuWatch(0)
    answer = time.time()
    a_us = int(answer * 1e6)
    fake.busy = (a_us - 50_000, a_us + 130_000)  # 130 ms of spin queued behind the answer
    t0 = time.perf_counter()
    after = watch.drain(answer)
    assert 0.13 <= after <= 0.13 + 2 * fake.period_us / 1e6  # to the end of the last busy sample's period
    assert time.time() * 1e6 >= fake.busy[1]  # the next turn starts on an idle GPU
    assert time.perf_counter() - t0 < 1.0


def test_a_gpu_busy_to_the_drain_limit_is_a_disturbance(nvml):
    fake = nvml([GPU_IDLE])
    watch = GpuWatch(0)
    answer = time.time()
    fake.busy = (int(answer * 1e6) - 1, int(answer * 1e6) + 10**9)
    assert watch.drain(answer, limit_s=0.1) is None
    report = GpuReport(sm_mhz=[1980], drained=True, drain_s=5.02, busy_after_answer_s=None)
    [d] = report.disturbances("cuda:0")
    assert d.startswith("cuda:0 was still busy 5 s after the turn's last answer")
    record = report.to_json()
    assert record["busy_after_answer_s"] is None and record["drain_s"] == 5.02
    assert "busy_after_answer_s" not in GpuReport().to_json()  # not drained: nothing to say


def test_the_gpu_is_drained_only_where_it_passes_to_another_system():
    a, b, ab = {"A": []}, {"B": []}, {"A": [], "B": []}
    assert hands_over([a, b, b, a, a, b]) == [True, False, True, False, True, False]
    assert hands_over([ab, ab]) == [False, False]  # the swapped design: both systems every turn


def _drained(a_busy: list[float | None], b_busy: list[float | None]) -> PairedRun:
    """An interleaved run whose drained turns saw the systems' kernels run this long past their answers."""
    turns = [TurnStats([lb], 0.1, {lb: 0.1}, {lb: 0.1}, gpu={lb: {"sm_mhz_max": 1980, "busy_after_answer_s": s}})
             for lb, busy in (("A", a_busy), ("B", b_busy)) for s in busy]  # fmt: skip
    slot = Slot.parse("cuda:0")
    return PairedRun(
        design="interleaved", periods=[PeriodResult({"A": {}, "B": {}}, {"A": slot, "B": slot}, {}, turns)]
    )


def test_the_candidates_kernels_past_its_answers_are_a_violation():
    run = _drained([0.0] * 12, [0.17] * 10 + [None, 0.0])
    finding, stuck = queued_past_answer(run)
    assert finding.startswith("system B's kernels ran on after its last answer in 11 of the 12 turns")
    assert stuck.endswith("in 1 turn: a block it can have set aside at will")
    assert finding in violations(run)


def test_one_turn_whose_kernels_outlast_the_drain_is_a_violation():
    """Still busy at the drain's limit is a disturbance that sets the block aside: the candidate
    must not choose which of its blocks count."""
    run = _drained([0.0] * 12, [0.0] * 11 + [None])
    [finding] = queued_past_answer(run)
    assert (
        finding
        == "system B's kernels were still running 5 s after its last answer in 1 turn: a block it can have set aside at will"
    )
    assert finding in violations(run)
    assert (
        queued_past_answer(_drained([None] + [0.0] * 11, [0.0] * 12)) == []
    )  # the baseline's: a disturbance


def test_kernels_past_the_answer_as_often_as_the_baselines_are_no_finding():
    within = _drained([0.17] * 6 + [0.0] * 6, [0.17] * 8 + [0.0] * 4)  # 8 against 6: within 1.5 × + 2
    assert queued_past_answer(within) == []
    assert queued_past_answer(_drained([0.0] * 12, [0.17, 0.17] + [0.0] * 10)) == []  # two: the slack
    assert queued_past_answer(_clocked([1980] * 3, [1980] * 3)) == []  # nothing drained


def test_a_gpu_without_utilization_samples_is_one_clear_error(nvml):
    nvml([GPU_IDLE]).sampled = False
    with pytest.raises(SpecPilotError, match=r"gives none \(Not Supported\): judge on a GPU whose driver"):
        GpuWatch(0).drain(time.time())
