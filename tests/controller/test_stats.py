from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from specpilot.controller.stats import (
    ALPHA,
    BETA,
    MIN_LOOK,
    PairedStats,
    PairSpeeds,
    RequestSpeeds,
    decide,
    look_levels,
    paired_stats,
    pooled_sd,
    sigma_for,
    spent,
)


def test_log_ratio_by_hand():
    # d = ½[log(22/10) + log(11/20)] = ½ log(1.21) = log(1.1)
    r = RequestSpeeds(a_s0=10.0, a_s1=20.0, b_s0=11.0, b_s1=22.0)
    assert r.log_ratio() == pytest.approx(math.log(1.1), abs=1e-12)
    assert PairSpeeds(a=10.0, b=11.0).log_ratio() == pytest.approx(math.log(1.1), abs=1e-12)


def _blocks(rng, n_blocks, n_req, gain, slot1_factor, noise, block_noise=0.0):
    blocks = []
    for _ in range(n_blocks):
        shift = math.exp(rng.normal(0, block_noise))  # a block's processes run a little fast or slow
        reqs = []
        for _ in range(n_req):
            base = rng.uniform(5, 50)  # requests differ in length and speed
            e = rng.normal(0, noise, 4)
            reqs.append(
                RequestSpeeds(
                    a_s0=base * math.exp(e[0]),
                    a_s1=base * slot1_factor * math.exp(e[1]),
                    b_s0=base * gain * shift * math.exp(e[2]),
                    b_s1=base * gain * shift * slot1_factor * math.exp(e[3]),
                )
            )
        blocks.append(reqs)
    return blocks


def test_swap_cancels_a_planted_slot_bias():
    rng = np.random.default_rng(0)
    blocks = _blocks(rng, n_blocks=6, n_req=10, gain=1.05, slot1_factor=2.0, noise=0.01)
    res = paired_stats(blocks)
    assert res.gain == pytest.approx(1.05, rel=0.005)
    # Without the swap, period 1 alone (B on the fast slot) would report ~2.1x.
    naive = math.exp(np.mean([math.log(r.b_s1 / r.a_s0) for b in blocks for r in b]))
    assert naive == pytest.approx(2.1, rel=0.02)
    assert 1.0 < res.lower_bound < res.gain < res.upper_bound


def test_bounds_are_the_t_interval_of_block_means_by_hand():
    """Blocks are the unit (fresh processes each); requests within a block are not independent."""
    rng = np.random.default_rng(1)
    blocks = _blocks(rng, n_blocks=7, n_req=5, gain=1.02, slot1_factor=1.1, noise=0.02)
    res = paired_stats(blocks, level=0.01, futility=0.2)
    means = np.array([np.mean([r.log_ratio() for r in b]) for b in blocks])
    n, m, sd = len(means), means.mean(), means.std(ddof=1)
    assert res.unit == "blocks" and res.n == 7 and res.level == 0.01
    assert math.log(res.lower_bound) == pytest.approx(
        m - sps.t.ppf(0.99, n - 1) * sd / math.sqrt(n), abs=1e-12
    )
    assert math.log(res.upper_bound) == pytest.approx(
        m + sps.t.ppf(0.8, n - 1) * sd / math.sqrt(n), abs=1e-12
    )
    assert res.gain == pytest.approx(math.exp(m))
    assert res.block_gains == pytest.approx(list(np.exp(means)))
    one = paired_stats(blocks[:1])
    assert one.lower_bound == 0.0 and one.upper_bound == math.inf  # one block bounds nothing


def test_block_noise_is_not_hidden_by_many_requests():
    """A block-level shift (one process pair running faster) is the noise that counts: 60 requests
    per block do not narrow the bound the way 60 independent samples would."""
    rng = np.random.default_rng(3)
    blocks = _blocks(rng, n_blocks=4, n_req=60, gain=1.0, slot1_factor=1.0, noise=0.002, block_noise=0.03)
    res = paired_stats(blocks)
    d = np.array([r.log_ratio() for b in blocks for r in b])
    as_requests = sps.ttest_1samp(d, 0.0, alternative="greater").confidence_interval(0.95).low
    assert math.log(res.lower_bound) < as_requests - 0.01


def test_pooled_sd_and_sigma_by_hand():
    runs = [[0.01, 0.03, 0.02], [0.0, 0.04]]
    sd, df = pooled_sd(runs)
    ss = (0.01 - 0.02) ** 2 + (0.03 - 0.02) ** 2 + 0 + 0.02**2 + 0.02**2
    assert df == 3 and sd == pytest.approx(math.sqrt(ss / 3))
    assert pooled_sd([[0.5]]) == (0.0, 0)
    assert sigma_for(2 * math.log(1.004), 4) == pytest.approx(0.004)


def test_spending_spends_alpha_by_the_last_look_and_never_more():
    k_max = 12
    for step in (1, 2):  # a look every block, or every round of two blocks (sliced on two cores)
        looks = list(range(MIN_LOOK + (step - 1) * (MIN_LOOK % 2), k_max + 1, step))
        levels = [look_levels(k, k_max, prev) for prev, k in zip([0, *looks], looks, strict=False)]
        assert sum(a for a, _ in levels) == pytest.approx(ALPHA)
        assert sum(b for _, b in levels) == pytest.approx(BETA)
        assert all(a > 0 for a, _ in levels)
    assert spent(k_max, k_max, 1.0) == pytest.approx(1.0) and spent(k_max + 5, k_max, 1.0) == pytest.approx(
        1.0
    )
    assert look_levels(k_max + 1, k_max, k_max) == (0.0, 0.0)  # past the planned looks nothing is left


def _sequential(rng, gain: float, sd: float, bar: float, k_max: int, step: int = 1) -> bool:
    """One sequential comparison with block log gains ~ N(log gain, sd), `step` blocks a round: approved?"""
    logs: list[float] = []
    prev = 0
    while len(logs) < k_max:
        logs += list(rng.normal(math.log(gain), sd, size=step))
        k = len(logs)
        if k < MIN_LOOK:
            continue
        alpha, beta = look_levels(k, k_max, prev)
        prev = k
        blocks = [[PairSpeeds(1.0, math.exp(x))] for x in logs]
        v = decide(
            paired_stats(blocks, alpha, beta), sigma=(bar - 0.01) / 2, changes_output=False, final=k >= k_max
        )
        if v.decided:
            return v.approved
    return False


@pytest.mark.parametrize("step", [1, 2])
def test_sequential_false_approvals_stay_under_alpha_at_the_bar(step):
    """A candidate exactly at the bar, judged with every look: approved at most α of the time."""
    rng = np.random.default_rng(7)
    bar = 0.02
    approved = sum(_sequential(rng, 1 + bar, sd=0.015, bar=bar, k_max=16, step=step) for _ in range(2000))
    assert approved / 2000 <= ALPHA


def test_sequential_design_approves_a_clear_gain_and_stops_early():
    rng = np.random.default_rng(8)
    assert sum(_sequential(rng, 1.06, sd=0.01, bar=0.02, k_max=15) for _ in range(200)) >= 190
    assert sum(_sequential(rng, 1.06, sd=0.01, bar=0.02, k_max=16, step=2) for _ in range(200)) >= 190


def _ps(gain, lb, ub=math.inf):
    return PairedStats(gain=gain, lower_bound=lb, upper_bound=ub, n=5)


def test_decide_threshold_and_output_change_bar():
    ok = decide(_ps(1.06, 1.025), sigma=0.005, changes_output=False)
    assert ok.approved and ok.decided and ok.threshold == pytest.approx(0.02) and ok.reasons == []
    changed = decide(_ps(1.06, 1.025), sigma=0.005, changes_output=True)
    assert not changed.approved and "output changes" in changed.reasons[0]
    low = decide(_ps(1.01, 1.015), sigma=0.005, changes_output=False)
    assert not low.approved and "+1.50%" in low.reasons[0]


def test_decide_is_undecided_until_a_bound_crosses_the_bar():
    open_ = decide(_ps(1.02, 1.0, 1.05), sigma=0.005, changes_output=False, final=False)
    assert not open_.decided and not open_.approved
    futile = decide(_ps(1.0, 0.98, 1.015), sigma=0.005, changes_output=False, final=False)
    assert futile.decided and not futile.approved


def test_decide_flags_implausible_gains_and_keeps_extra_reasons():
    v = decide(_ps(4.0, 3.5), sigma=0.0, changes_output=False)
    assert not v.approved and "implausibly large" in v.reasons[0]
    v = decide(
        _ps(1.2, 1.1), sigma=0.0, changes_output=False, extra_reasons=["audit: mismatch rate"], final=False
    )
    assert not v.approved and v.decided and v.reasons == ["audit: mismatch rate"]
