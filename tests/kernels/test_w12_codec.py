"""W12 codec: bit-exact round trips, the window rule, escapes, the load-time check, bits/weight."""

from __future__ import annotations

import pytest
import torch

from specpilot.kernels.w12 import W12FormatError, decode, encode, verify
from specpilot.kernels.w12.codec import choose_window
from specpilot.kernels.w12.format import RECORD_BYTES

from .w12_data import random_bits, trained_like, with_specials


def _roundtrip(w: torch.Tensor):
    t = encode(w)
    t.check()
    back = decode(t)
    assert back.dtype == torch.bfloat16 and back.shape == w.shape
    assert torch.equal(back.view(torch.int16), w.view(torch.int16))  # bits, so NaN == NaN
    verify(t, w)
    return t


def _dists(n: int, k: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "gaussian": (torch.randn(n, k, generator=g) * 0.02).bfloat16(),
        "uniform": (torch.rand(n, k, generator=g) - 0.5).bfloat16(),
        "laplace": torch.distributions.Laplace(0.0, 0.01).sample((n, k)).bfloat16(),
        "trained_like": trained_like(n, k),
        "log_uniform_all_binades": (
            torch.exp2(torch.rand(n, k, generator=g) * 250 - 125) * torch.sign(torch.randn(n, k, generator=g))
        ).bfloat16(),
        "every_bit_pattern": random_bits(n, k),
        "specials": with_specials((torch.randn(n, k, generator=g) * 0.05).bfloat16()),
        "all_zero": torch.zeros(n, k, dtype=torch.bfloat16),
        "negative_zero": torch.full((n, k), -0.0, dtype=torch.bfloat16),
        "constant": torch.full((n, k), 0.375, dtype=torch.bfloat16),
        "all_nan": torch.full((n, k), float("nan"), dtype=torch.bfloat16),
        "denormal_only": torch.full((n, k), 1e-39, dtype=torch.bfloat16),
    }


@pytest.mark.parametrize("shape", [(1, 1), (3, 70), (130, 64), (129, 200), (256, 128)])
def test_roundtrip_is_bit_exact_on_many_distributions(shape):
    for name, w in _dists(*shape).items():
        t = _roundtrip(w)
        assert t.records.shape[2] == RECORD_BYTES, name


def test_escapes_hold_exactly_the_weights_outside_the_window():
    w = with_specials(trained_like(128, 256))
    t = encode(w)
    bits = w.view(torch.int16).to(torch.int32) & 0xFFFF
    e = (bits >> 7) & 0xFF
    top = t.exps.to(torch.int32)[:, None]
    off = e - (top - 15)
    reserved = (off == 0) & (((bits >> 4) & 7) == 0)
    zero = (bits & 0x7FFF) == 0  # +0 and -0 are the reserved code of their sign, not escapes
    outside = ((e == 0) | (e == 255) | (off < 0) | (off > 15) | reserved) & ~zero
    assert t.n_raw == 0 and t.n_escapes == int(outside.sum())
    rows = torch.repeat_interleave(torch.arange(128), (t.esc_ptr[1:] - t.esc_ptr[:-1]).long())
    assert torch.equal(outside.nonzero()[:, 0], rows)
    assert torch.equal(outside.nonzero()[:, 1], t.esc_col.long())


def test_window_leaves_fewest_outside_and_ties_take_the_smallest_top():
    def row(exps):
        return torch.tensor([[e << 7 for e in exps]], dtype=torch.int32).to(torch.int16)

    # 10 weights at exponent 100, 3 at 120: windows with top 100..115 keep 10, top 120 keeps 3;
    # the smallest top that keeps 10 is 100
    assert int(choose_window(row([100] * 10 + [120] * 3))[0]) == 100
    # 3 at 100 and 10 at 120: no window holds both; the 10 win -> top 120
    assert int(choose_window(row([100] * 3 + [120] * 10))[0]) == 120
    # 8 at 100, 8 at 110, 9 at 120: [105, 120] keeps 17 (110 and 120) -> smallest such top is 120
    assert int(choose_window(row([100] * 8 + [110] * 8 + [120] * 9))[0]) == 120
    # everything within 16 binades: the smallest top that covers all of them is the max exponent
    assert int(choose_window(row([90, 95, 100]))[0]) == 100
    # 5 at 60 and 5 at 100: a tie between two windows -> the smaller top (60)
    assert int(choose_window(row([60] * 5 + [100] * 5))[0]) == 60
    # no normal weight (zeros, inf, NaN): top 16, everything escapes
    assert int(choose_window(row([0, 255, 0]))[0]) == 16


def _raw(t) -> torch.Tensor:
    mask = torch.zeros(t.shape[0], dtype=torch.bool)
    mask[t.raw_rows.long()] = True
    return mask


def test_zeros_cost_nothing_extra_and_signed_zeros_come_back():
    z = torch.zeros(256, 256, dtype=torch.bfloat16)
    z[::2] = -0.0
    t = _roundtrip(z)
    assert (
        t.n_escapes == 0 and t.n_raw == 0 and t.bits_per_weight() <= 12 + 40 / 256 + 1e-3
    )  # + exps, esc_ptr
    w = trained_like(256, 512)
    w[torch.rand(256, 512, generator=torch.Generator().manual_seed(3)) < 0.3] = 0.0
    assert _roundtrip(w).bits_per_weight() < 12.1  # 30% zeros (21.7 bits when zeros escaped)


def test_a_row_escaping_more_than_one_weight_in_eight_is_stored_raw():
    k = 512
    w = trained_like(256, k)
    # row 5: 65 weights far outside its window (> k / 8 escapes); row 9: 60 (coded stays cheaper)
    w[5, :65] = 3e30
    w[9, :60] = 3e30
    t = _roundtrip(w)
    assert _raw(t).nonzero().squeeze(1).tolist() == [5]
    assert t.n_coded == 255 and t.exps.shape == (255,)
    q = decode(t, qpass=True)
    assert torch.equal(q[5].view(torch.int16), w[5].view(torch.int16))  # raw rows stay exact


@pytest.mark.parametrize(
    "shape", [(256, 64), (128, 512), (300, 700), (129, 4096), (2, 64), (1000, 96), (5, 3000)]
)
def test_no_matrix_costs_more_than_raw_bf16(shape):
    """The worst case over every distribution (random bits, all NaN, all denormal, exponents over
    all binades): max(16.5, 16 + 16 / K + 32 / (N K)) bits per weight: 16.5 from K = 64."""
    n, k = shape
    for name, w in _dists(n, k).items():
        t = _roundtrip(w)
        assert t.nbytes() * 8 <= max(16.5 * n * k, n * (16 * k + 16) + 32), (name, t.stats())
        assert t.bits_per_weight() <= 16.5, (name, t.stats())


def test_trained_weights_keep_every_row_coded():
    for n, k in ((576, 576), (192, 576), (1536, 576), (576, 1536), (256, 5120)):
        t = encode(trained_like(n, k, seed=n + k))
        assert t.n_raw == 0, (n, k)


def test_qpass_decode_sets_the_discarded_mantissa_bits_to_the_midpoint():
    w = trained_like(128, 128)
    t = encode(w)
    q = decode(t, qpass=True).view(torch.int16).to(torch.int32) & 0xFFFF
    src = w.view(torch.int16).to(torch.int32) & 0xFFFF
    rows = torch.repeat_interleave(torch.arange(128), (t.esc_ptr[1:] - t.esc_ptr[:-1]).long())
    escaped = torch.zeros(128, 128, dtype=torch.bool)
    escaped[rows, t.esc_col.long()] = True
    assert torch.equal(q[escaped], src[escaped])  # escapes stay exact
    assert torch.equal(q[~escaped], (src[~escaped] & ~0xF) | 8)


def test_load_time_check_catches_a_corrupt_record_and_a_wrong_source():
    w = trained_like(128, 128)
    t = encode(w)
    verify(t, w)
    t.records[0, 1, 77] ^= 0x10
    with pytest.raises(W12FormatError, match="differs from its source"):
        verify(t, w)
    t = encode(w)
    other = w.clone()
    other[3, 3] = 1.0
    with pytest.raises(W12FormatError, match="differs"):
        verify(t, other)


def test_malformed_parts_are_rejected_with_a_clear_error():
    t = encode(trained_like(16, 64))
    t.esc_ptr = t.esc_ptr.clone()
    t.esc_ptr[-1] += 1
    with pytest.raises(W12FormatError, match="esc_ptr"):
        t.check()
    with pytest.raises(W12FormatError, match="bfloat16"):
        encode(torch.zeros(4, 4))
    w = trained_like(128, 64)
    w[3] = float("nan")
    t = encode(w)
    assert t.raw_rows.tolist() == [3]
    t.raw_rows = torch.tensor([128], dtype=torch.int16)
    with pytest.raises(W12FormatError, match="raw_rows"):
        t.check()
    t = encode(w)
    t.raw_bits = t.raw_bits[:, :5]
    with pytest.raises(W12FormatError, match="raw_bits"):
        t.check()


def test_wide_matrices_use_int32_columns():
    w = trained_like(128, 40000)
    w[1, 39999] = float("inf")
    t = _roundtrip(w)
    assert t.esc_col.dtype == torch.int32 and int(t.esc_col.max()) == 39999


def test_bits_per_weight_on_trained_like_27b_shapes():
    """Realistic (trained-like) weights at the 27B-class K: <= 12.02 bits/weight, everything counted."""
    for k in (5120, 8192):
        t = encode(trained_like(256, k, seed=k))
        s = t.stats()
        assert 12.0 < s["bits_per_weight"] <= 12.02, s
        assert s["escape_rate"] < 5e-4, s
