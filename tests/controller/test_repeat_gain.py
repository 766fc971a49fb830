"""The repeat check (controller/checks.py `repeat_gain`): every block of a comparison serves the same
draw, so a candidate that carried its answers from one block's processes to a later one's would run
faster on the repeats only. Here the blocks are laid out as `paired_run` records them: requests'
speed pairs per block, a round per block or two (a block per core), a block's processes a little
fast or slow, noise per request. The same check on a real jailed candidate that carries its answers
through the page cache: tests/controller/test_judge.py."""

from __future__ import annotations

import re

import numpy as np
import pytest

from specpilot.controller.checks import REPEAT_ALPHA, REPEAT_FLOOR, repeat_gain
from specpilot.controller.paired import PairedRun
from specpilot.controller.stats import PairSpeeds


def _run(seed: int, *, gain: float = 1.2, repeat: float = 1.0, rounds: int = 4, per_round: int = 2,
         requests: int = 4, noise: float = 0.01, disturbed: tuple[int, ...] = ()) -> PairedRun:  # fmt: skip
    """B `gain` × A's speed on a first serve, `gain × repeat` on a repeat; `disturbed`: blocks set aside."""
    rng = np.random.default_rng(seed)
    run = PairedRun(design="sliced")
    for r in range(rounds):
        for _ in range(per_round):
            shift = rng.normal(0, 0.02)  # both systems of a block share its processes' pace
            speeds = []
            for _ in range(requests):
                a = 50.0 * np.exp(shift + rng.normal(0, noise))
                b = a * gain * (repeat if r > 0 else 1.0) * np.exp(rng.normal(0, noise))
                speeds.append(PairSpeeds(float(a), float(b)))
            run.blocks.append(speeds)
            run.block_disturbances.append(["load on cpu:0"] if len(run.blocks) - 1 in disturbed else [])
            run.block_rounds.append(r)
    return run


def test_a_candidate_faster_on_repeats_is_a_finding_naming_both_gains():
    [finding] = repeat_gain(_run(0, gain=1.0, repeat=1.5))
    m = re.fullmatch(r"the candidate gained \+(\d+\.\d)% on the requests it had served before against ([-+]\d+\.\d)% "
                     r"on their first serve \(excess .*, 2 and 6 blocks\): a system that runs faster on repeats "
                     r"carries something from one process to the next", finding)  # fmt: skip
    assert m, finding
    assert 45 < float(m[1]) < 55 and abs(float(m[2])) < 3


@pytest.mark.parametrize("per_round, rounds", [(2, 2), (1, 5)])
def test_a_large_carry_is_found_within_a_few_rounds(per_round, rounds):
    """Two rounds of a block per core (two cores); five of one block (a batch or interleaved
    design): the first round's one block leaves the spread to the repeats, and α is strict."""
    assert repeat_gain(_run(1, gain=1.0, repeat=1.5, rounds=rounds, per_round=per_round))


def test_the_aa_spread_lets_three_blocks_tell():
    """A one-block round (interleaved, a GPU's design) decided at the first look has three blocks:
    alone they leave one degree of freedom; with Phase 0's A/A spread pooled in, the carry shows."""
    run = _run(1, gain=1.0, repeat=1.5, rounds=3, per_round=1)
    assert repeat_gain(run) == []
    assert repeat_gain(run, aa=(0.01, 8))
    assert repeat_gain(_run(1, gain=1.3, rounds=3, per_round=1), aa=(0.01, 8)) == []


def test_an_honest_gain_is_no_finding_at_the_false_alarm_rate():
    """Honest candidates, a gain the same on every serve: findings no more often than REPEAT_ALPHA
    allows (the floor makes them rarer still), over run lengths the judge takes."""
    # the run's own spread alone, and pooled with an A/A's as large (block sd: 0.03 · √2 / √4 requests)
    for aa in [(0.0, 0), (0.02, 8)]:
        alarms = sum(
            bool(
                repeat_gain(_run(seed, gain=1.3, rounds=2 + seed % 6, per_round=1 + seed % 2, noise=0.03), aa)
            )
            for seed in range(2000)
        )
        assert alarms <= 2000 * REPEAT_ALPHA + 2, (aa, alarms)


def test_a_carry_under_the_floor_is_no_finding_however_sure():
    """A repeat gain below REPEAT_FLOOR is measured plainly and is no finding: it is the floor's
    price (such a candidate gains at most that much by carrying)."""
    run = _run(2, gain=1.0, repeat=np.exp(REPEAT_FLOOR * 0.6), rounds=12, noise=0.001)
    assert repeat_gain(run) == []
    assert repeat_gain(_run(2, gain=1.0, repeat=np.exp(REPEAT_FLOOR * 1.6), rounds=12, noise=0.001))


def test_too_few_blocks_tell_nothing():
    assert repeat_gain(_run(3, gain=1.0, repeat=2.0, rounds=1), aa=(0.01, 8)) == []  # no repeat yet
    assert repeat_gain(_run(3, gain=1.0, repeat=2.0, rounds=2, per_round=1)) == []  # no spread to pool


def test_a_first_round_set_aside_still_counts_as_the_first_serves():
    """A candidate that could have its first round's blocks set aside must not hide its first
    serves that way: where no first-round block is quiet, all of them stand for it."""
    run = _run(4, gain=1.0, repeat=1.5, disturbed=(0, 1))
    assert repeat_gain(run)
    # a later disturbed block is only set aside
    assert repeat_gain(_run(4, gain=1.0, repeat=1.5, disturbed=(2,)))
    assert repeat_gain(_run(4, gain=1.2, disturbed=(0, 1))) == []
