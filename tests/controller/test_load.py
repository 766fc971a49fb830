"""The load check's arithmetic: per-core busy and stolen time from /proc/stat, and what is foreign."""

from __future__ import annotations

import os

import pytest

from specpilot.controller.load import CoreTimes, core_times, foreign_load

TICK = os.sysconf("SC_CLK_TCK")
STAT = """cpu  900 0 300 9000 10 0 5 7 0 0
cpu0 400 0 100 4500 5 0 2 3 0 0
cpu1 500 0 200 4500 5 0 3 4 0 0
intr 12345
ctxt 678
"""


def test_core_times_reads_busy_and_steal_per_core(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    got = core_times([1, 5], stat)
    assert list(got) == [1]  # a core the machine lacks is left out
    # busy = user + nice + system + irq + softirq + steal (idle and iowait are not); irq = irq + softirq
    assert got[1] == CoreTimes((500 + 0 + 200 + 0 + 3 + 4) / TICK, 4 / TICK, (0 + 3) / TICK)


def test_core_times_on_this_machine_grow():
    first = core_times([0])[0]
    sum(i * i for i in range(200_000))  # burn a little CPU somewhere
    assert core_times([0])[0].busy_s >= first.busy_s


def test_foreign_is_what_the_core_did_besides_the_system_and_the_controller():
    before, after = CoreTimes(10.0, 1.0), CoreTimes(19.0, 1.5)  # 9 s busy in a 10 s window
    ld = foreign_load(before, after, own_cpu_s=7.5, wall_s=10.0, harness_s=0.5)
    assert ld["foreign_s"] == pytest.approx(1.0)
    assert ld["foreign_share"] == pytest.approx(0.1)
    assert ld["steal_s"] == pytest.approx(0.5)
    assert ld["harness_s"] == 0.5


def test_foreign_never_goes_negative():
    """The system's and controller's counters and the kernel's ticks disagree by a tick or so."""
    ld = foreign_load(CoreTimes(0.0, 0.0), CoreTimes(1.0, 0.0), own_cpu_s=0.99, wall_s=1.0, harness_s=0.2)
    assert ld["foreign_s"] == 0.0 and ld["foreign_share"] == 0.0


def test_a_turn_shorter_than_the_counters_resolution_is_not_disturbed_by_one_tick():
    """/proc/stat and a process's CPU time count in clock ticks (10 ms at 100 Hz): in a 30 ms GPU
    turn, one tick the core spent besides the system read as 26% (an H200 Phase 0 refused on it).
    A turn is disturbed only past the limit plus two ticks; a longer turn is judged as before."""
    tick = 1 / TICK
    one = foreign_load(CoreTimes(0.0, 0.0), CoreTimes(4 * tick, 0.0), own_cpu_s=3 * tick, wall_s=0.03)
    assert one["foreign_s"] == pytest.approx(tick) and not one["disturbed"]
    busy = foreign_load(CoreTimes(0.0, 0.0), CoreTimes(0.03, 0.0), own_cpu_s=0.0, wall_s=0.03)
    assert busy["disturbed"]  # a turn the core spent wholly on something else
    long = foreign_load(CoreTimes(0.0, 0.0), CoreTimes(9.0, 0.0), own_cpu_s=7.5, wall_s=10.0)
    assert long["disturbed"]  # 15% of 10 s: the slack is 2 ticks, not a share


def test_a_period_sums_its_turns_so_steady_load_in_short_turns_is_seen():
    """Other load of 20% in each of forty 50 ms turns passes every turn's check (one tick each) but
    not the period's: the period sums each core's turns, unclipped (a tick's rounding one way in
    one turn offsets another's), and holds them to the limit with no slack."""
    from specpilot.controller.load import summed

    tick = 1 / TICK
    steady = [foreign_load(CoreTimes(0.0, 0.0), CoreTimes(5 * tick, 0.0), own_cpu_s=4 * tick, wall_s=0.05)
              for _ in range(40)]  # fmt: skip
    assert not any(ld["disturbed"] for ld in steady)
    assert summed(steady)["disturbed"] and summed(steady)["foreign_share"] == pytest.approx(0.2)
    # rounding: one turn reads a tick over, the next a tick under; no other load in sum
    jitter = [foreign_load(CoreTimes(0.0, 0.0), CoreTimes((5 + (-1) ** i) * tick, 0.0), own_cpu_s=5 * tick,
                           wall_s=0.05) for i in range(40)]  # fmt: skip
    assert not summed(jitter)["disturbed"] and summed(jitter)["foreign_s"] == pytest.approx(0.0, abs=1e-9)


def test_a_period_names_each_core_whose_summed_turns_pass_the_limit():
    """`over_turns`: per core over the period's turns (two labels on one core share one record,
    counted once); a core of one turn is left to the turn's own check."""
    from specpilot.controller.load import over_turns

    tick = 1 / TICK

    def turn(core: int, foreign_ticks: int) -> dict:
        ld = foreign_load(CoreTimes(0.0, 0.0), CoreTimes((4 + foreign_ticks) * tick, 0.0), own_cpu_s=4 * tick,
                          wall_s=0.05) | {"core": core}  # fmt: skip
        return {"A": ld, "B": ld}

    turns = [turn(3, 1) for _ in range(20)] + [{"A": turn(5, 0)["A"]} for _ in range(20)]
    assert over_turns(turns) == [
        "other load on cpu:3: 20% of the period's turns went to something besides the systems"
    ]
    assert over_turns([turn(3, 3)]) == []


def test_disturbances_are_summarised_once_per_kind_with_their_range():
    from specpilot.controller.load import summarize

    turns = [f"other load on cpu:{i % 2}: {p}% of the turn went to something besides system {'AB'[i % 2]}"
             for i, p in enumerate((24, 35, 30, 27))]  # fmt: skip
    assert summarize([*turns, "GPU clocks changed during the turn"]) == (
        "other load on a slot: 24–35% of the turn went to something besides the system (4 times); "
        "GPU clocks changed during the turn"
    )


def _run_with_speeds(speeds: dict[str, float]):
    """A paired run whose baseline answered each request id at the given tokens/s."""
    from specpilot.controller.engine import RequestResult
    from specpilot.controller.paired import PairedRun
    from specpilot.controller.period import PeriodResult
    from specpilot.controller.slots import Slot

    res = {rid: RequestResult(rid, 0.0, 40 / v, tokens=[0] * 40) for rid, v in speeds.items()}
    period = PeriodResult({"A": res, "B": {}}, {"A": Slot.parse("cpu:0"), "B": Slot.parse("cpu:1")}, {})
    return PairedRun(periods=[period])


def test_baseline_speed_is_compared_per_request_on_the_requests_both_measured():
    from specpilot.controller.checks import baseline_slowed

    sources = {"r01": "HumanEval/1", "r02": "HumanEval/2", "r03": "HumanEval/3"}
    record = {"HumanEval/1": 20.0, "HumanEval/2": 12.0, "HumanEval/3": 30.0, "HumanEval/9": 5.0}
    # the same requests at their recorded speeds: nothing, however different the requests are
    assert baseline_slowed(_run_with_speeds({"r01": 20.0, "r02": 12.0, "r03": 30.0}), record, sources) == []
    # 30% slower on each of them: named, with how many requests the ratio rests on
    slow = baseline_slowed(_run_with_speeds({"r01": 14.0, "r02": 8.4, "r03": 21.0}), record, sources)
    assert len(slow) == 1 and "30% slower" in slow[0] and "3 requests" in slow[0]
    # another draw (prompts of other speeds) shares too few requests with the record: no finding
    other = {"r01": "HumanEval/7", "r02": "HumanEval/2", "r03": "HumanEval/8"}
    assert baseline_slowed(_run_with_speeds({"r01": 5.0, "r02": 8.0, "r03": 6.0}), record, other) == []
    assert baseline_slowed(_run_with_speeds({"r01": 5.0}), None, sources) == []
