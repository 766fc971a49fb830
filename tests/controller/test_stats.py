from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from specpilot.controller.stats import (
    PairedStats,
    RequestSpeeds,
    decide,
    noise_sigma,
    noisier_than_stock,
    paired_stats,
    within_request_spread,
)


def test_log_ratio_by_hand():
    # d = ½[log(22/10) + log(11/20)] = ½ log(1.21) = log(1.1)
    r = RequestSpeeds(a_s0=10.0, a_s1=20.0, b_s0=11.0, b_s1=22.0)
    assert r.log_ratio() == pytest.approx(math.log(1.1), abs=1e-12)


def _blocks(rng, n_blocks, n_req, gain, slot1_factor, noise):
    blocks = []
    for _ in range(n_blocks):
        reqs = []
        for _ in range(n_req):
            base = rng.uniform(5, 50)  # requests differ in length and speed
            e = rng.normal(0, noise, 4)
            reqs.append(
                RequestSpeeds(
                    a_s0=base * math.exp(e[0]),
                    a_s1=base * slot1_factor * math.exp(e[1]),
                    b_s0=base * gain * math.exp(e[2]),
                    b_s1=base * gain * slot1_factor * math.exp(e[3]),
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
    assert 1.0 < res.lower_bound < res.gain


def test_lower_bound_matches_the_t_interval_by_hand():
    rng = np.random.default_rng(1)
    blocks = _blocks(rng, n_blocks=7, n_req=5, gain=1.02, slot1_factor=1.1, noise=0.02)
    res = paired_stats(blocks)
    means = np.array([np.mean([r.log_ratio() for r in b]) for b in blocks])
    n, m, sd = len(means), means.mean(), means.std(ddof=1)
    by_hand = m - sps.t.ppf(0.95, n - 1) * sd / math.sqrt(n)
    assert res.unit == "blocks" and res.n == 7
    assert math.log(res.lower_bound) == pytest.approx(by_hand, abs=1e-12)
    assert res.gain == pytest.approx(math.exp(m))
    assert res.block_gains == pytest.approx(list(np.exp(means)))


def test_fewer_than_five_blocks_use_requests_as_unit():
    rng = np.random.default_rng(2)
    blocks = _blocks(rng, n_blocks=4, n_req=6, gain=1.0, slot1_factor=1.0, noise=0.02)
    res = paired_stats(blocks)
    assert (res.unit, res.n) == ("requests", 24)
    d = np.array([r.log_ratio() for b in blocks for r in b])
    low = sps.ttest_1samp(d, 0.0, alternative="greater").confidence_interval(0.95).low
    assert math.log(res.lower_bound) == pytest.approx(low)


def test_noise_sigma_is_the_standard_error_of_the_aa_gain():
    aa = PairedStats(gain=1.0, lower_bound=0.99, unit="blocks", n=4, log_sd=2 * math.log(1.004))
    assert noise_sigma(aa) == pytest.approx(0.004)


def _ps(gain, lb):
    return PairedStats(gain=gain, lower_bound=lb, unit="blocks", n=5)


def test_decide_threshold_and_output_change_bar():
    ok = decide(_ps(1.06, 1.025), sigma=0.005, changes_output=False)
    assert ok.approved and ok.threshold == pytest.approx(0.02) and ok.reasons == []
    # Same figures, but the output changes: the bar is 3% + 2σ.
    changed = decide(_ps(1.06, 1.025), sigma=0.005, changes_output=True)
    assert not changed.approved and "output changes" in changed.reasons[0]
    low = decide(_ps(1.01, 1.015), sigma=0.005, changes_output=False)
    assert not low.approved and "+1.50%" in low.reasons[0]


def test_decide_flags_implausible_gains_and_keeps_extra_reasons():
    v = decide(_ps(4.0, 3.5), sigma=0.0, changes_output=False)
    assert not v.approved and "implausibly large" in v.reasons[0]
    v = decide(_ps(1.2, 1.1), sigma=0.0, changes_output=False, extra_reasons=["audit: mismatch rate"])
    assert not v.approved and v.reasons == ["audit: mismatch rate"]


def _speeds(d: float) -> RequestSpeeds:
    """A request whose swap-averaged log ratio is exactly d (B sped up by e^d on both slots)."""
    return RequestSpeeds(a_s0=10.0, a_s1=20.0, b_s0=10.0 * math.exp(d), b_s1=20.0 * math.exp(d))


def test_within_request_spread_by_hand():
    # Request 1: 0.01, 0.03 (mean 0.02); request 2: 0.10, 0.10. Residuals ±0.01, 0, 0: var = 2e-4 / 2.
    blocks = [[_speeds(0.01), _speeds(0.10)], [_speeds(0.03), _speeds(0.10)]]
    var, df = within_request_spread(blocks)
    assert df == 2 and var == pytest.approx(1e-4, abs=1e-12)
    assert math.isnan(within_request_spread(blocks[:1])[0]) and within_request_spread(blocks[:1])[1] == 0


def test_within_request_spread_ignores_uneven_gains_across_requests():
    """A candidate that helps one request far more than another is not noisy; a shifted block is."""
    even = [[_speeds(0.0), _speeds(0.5)], [_speeds(0.0), _speeds(0.5)]]
    assert within_request_spread(even)[0] == pytest.approx(0.0, abs=1e-20)
    shifted = [[_speeds(0.0), _speeds(0.5)], [_speeds(0.2), _speeds(0.7)]]
    assert within_request_spread(shifted)[0] == pytest.approx(0.01 * 4 / 2, abs=1e-12)


def test_noisier_than_stock_is_the_one_sided_f_test():
    assert noisier_than_stock(4e-4, 6, 1e-4, 8) == pytest.approx(sps.f.sf(4.0, 6, 8), rel=1e-12)
    assert noisier_than_stock(1e-4, 6, 1e-4, 8) > 0.4
    assert noisier_than_stock(1e-2, 6, 1e-4, 8) < 1e-3
    # Nothing to compare against (no A/A spread stored, or one block): no objection.
    assert noisier_than_stock(1e-2, 6, math.nan, 0) == 1.0
    assert noisier_than_stock(math.nan, 0, 1e-4, 8) == 1.0
