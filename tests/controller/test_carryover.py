"""The carryover check (controller/checks.py): in the interleaved design, the candidate's work
running on into the baseline's turns (a GPU's queued kernels outlive a frozen process).

The runs are laid out in the order `paired.interleaved_schedule` serves them, X and Y drawn once
and swapped block by block as `paired_run` orders them; each turn's time is a request's own length times a block
factor, the system's speed, noise, and a planted slowdown when the turn follows the other system's.
"""

from __future__ import annotations

import math
import random
import re

import numpy as np
import pytest

from specpilot.controller.checks import CARRYOVER_FLOOR, carryover, violations
from specpilot.controller.engine import Request, RequestResult
from specpilot.controller.paired import PairedRun, interleaved_schedule
from specpilot.controller.period import PeriodResult
from specpilot.controller.slots import Slot

TOKENS = 32


def _run(seed: int, *, into_a: float = 0.0, into_b: float = 0.0, blocks: int = 8, requests: int = 8,
         noise: float = 0.01, gain: float = 1.0, design: str = "interleaved", order: str | None = None) -> PairedRun:  # fmt: skip
    """`into_a`: how much slower (log time) A serves right after B's turn; `into_b`: B after A's."""
    rng, draw = np.random.default_rng(seed), random.Random(seed)
    warm = [Request(id="w0", input_ids=[1], max_new_tokens=TOKENS)]
    measured = [Request(id=f"r{i}", input_ids=[1], max_new_tokens=TOKENS) for i in range(requests)]
    length = {r.id: rng.uniform(0.05, 0.5) for r in warm + measured}  # requests differ in length
    slot = Slot.parse("cuda:0")
    run = PairedRun(design=design, warmup_ids={"w0"})
    first = draw.sample(["A", "B"], 2)
    for k in range(blocks):
        x, y = order or (first if k % 2 == 0 else first[::-1])
        shift = rng.normal(0, 0.02)  # a block's processes run a little fast or slow
        results: dict[str, dict[str, RequestResult]] = {"A": {}, "B": {}}
        clock, prev = 0.0, None
        for turn in interleaved_schedule(warm, measured, x, y):
            [(label, reqs)] = turn.items()
            carry = {("A", "B"): into_a, ("B", "A"): into_b}.get((label, prev), 0.0)
            for req in reqs:
                log_t = shift + rng.normal(0, noise) + carry - (math.log(gain) if label == "B" else 0.0)
                seconds = length[req.id] * math.exp(log_t)
                results[label][req.id] = RequestResult(req.id, clock, clock + seconds, tokens=[7] * TOKENS)
                clock += seconds + 0.001
            prev = label
        run.periods.append(PeriodResult(results, {"A": slot, "B": slot}, {}))
    return run


@pytest.mark.parametrize("seed", range(5))
def test_an_honest_pair_is_no_finding_even_with_a_slowdown_both_ways(seed):
    assert carryover(_run(seed, gain=1.3)) == []
    # Both systems slower right after the other's turn (caches each warms for itself): it cancels in
    # the pair, so it is no finding however large.
    assert carryover(_run(seed, into_a=0.05, into_b=0.05)) == []


@pytest.mark.parametrize("seed", range(5))
def test_the_candidates_work_running_on_into_the_baselines_turns_is_named(seed):
    [finding] = carryover(_run(seed, into_a=0.04, gain=0.97))
    slower = float(
        re.search(r"the baseline ran ([\d.]+)% slower right after the candidate's turns", finding)[1]
    )
    assert abs(slower - 4.08) < 1.5, finding  # e^0.04 - 1, within ~3 standard errors
    assert "runs on into the baseline's turns" in finding
    # Beyond the baseline's own slowdown after the candidate's turns, not in place of it.
    assert carryover(_run(seed, into_a=0.09, into_b=0.05)) != []
    # A violation of the comparison (evaluate.py makes it an integrity reason).
    assert finding in violations(_run(seed, into_a=0.04, gain=0.97))


def test_the_baseline_slowing_the_candidate_or_a_slowdown_below_the_floor_is_no_finding():
    assert carryover(_run(0, into_b=0.08)) == []
    assert carryover(_run(0, into_a=CARRYOVER_FLOOR / 2, noise=0.001)) == []


def test_a_run_that_cannot_tell_the_orders_apart_is_no_finding():
    # Who goes first the same in every block (as when it was drawn per block, a quarter of 3-block
    # runs): "after the other's turn" is then the request's place.
    assert carryover(_run(0, into_a=0.2, order="AB")) == []
    assert carryover(_run(0, into_a=0.2, blocks=1)) == []
    assert carryover(_run(0, into_a=0.2, design="sliced")) == []
