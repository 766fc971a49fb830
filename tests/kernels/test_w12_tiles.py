"""W12 weight tiles (kernels/w12/tiles.py): the kernels' copy of a matrix holds it exactly.

`tile_bits` is the fused kernels' tile arithmetic in torch (exact exponents, reserved codes as
signed zeros, escaped slots +0); `with_escapes` puts the escape lists back. The GPU tests
(tests/gpu/test_w12_entry_gpu.py) hold the Triton tiles to tile_bits and a tile-plus-escapes
GEMV to the exact sum.
"""

from __future__ import annotations

import pytest
import torch

from specpilot.kernels.w12.format import W12FormatError
from specpilot.kernels.w12.tiles import TileWeight, check_tile, tile_bits, tile_weight, with_escapes

from .w12_data import random_bits, trained_like, with_specials


def _bits(w: torch.Tensor) -> torch.Tensor:
    return w.view(torch.int16)


@pytest.mark.parametrize(("n", "k", "seed"), [(128, 64, 0), (230, 250, 1), (300, 1000, 2), (250, 640, 3)])
def test_tiles_and_escapes_rebuild_every_weight(n, k, seed):
    """Ragged edges, zeros of both signs, denormals, inf, NaN payloads and far outliers."""
    w = with_specials(trained_like(n, k, seed=seed), seed=seed)
    w[0, :3] = torch.tensor([0.0, -0.0, 1e-39])
    tw = tile_weight(w)
    assert isinstance(tw, TileWeight) and tw.escapes > 0
    tile = tile_bits(tw)
    e = tw.escapes
    rows, cols = tw.esc_row[:e].long(), tw.esc_col[:e].long()
    assert not bool(_bits(tile)[rows, cols].any()), "an escaped slot is +0 in the tile"
    keep = torch.ones_like(tile, dtype=torch.bool)
    keep[rows, cols] = False
    assert torch.equal(_bits(tile)[keep], _bits(w)[keep])
    assert torch.equal(_bits(with_escapes(tw, tile)), _bits(w))


def test_the_escape_lists_are_a_csr_over_channels():
    w = trained_like(256, 128, seed=5)
    planted = [(3, 5, 1e-39), (3, 70, -3e-20), (130, 5, float("-inf"))]
    for n, c, v in planted:
        w[n, c] = v
    tw = tile_weight(w)
    assert tw.esc_ptr.shape == (257,) and int(tw.esc_ptr[0]) == 0
    rows, cols = tw.esc_row.tolist(), tw.esc_col.tolist()
    for n in range(256):
        lo, hi = int(tw.esc_ptr[n]), int(tw.esc_ptr[n + 1])
        assert rows[lo:hi] == [n] * (hi - lo) and cols[lo:hi] == sorted(cols[lo:hi])
    at = {(r, c): i for i, (r, c) in enumerate(zip(rows, cols, strict=True))}
    for n, c, _ in planted:
        assert int(tw.esc_bits[at[n, c]]) == int(_bits(w)[n, c])


def test_channels_past_n_have_no_escapes():
    w = trained_like(200, 64, seed=9)
    w[199, 1] = float("nan")
    tw = tile_weight(w)
    assert tw.esc_ptr.shape == (257,)  # two 128-row bands: a tile may ask for any channel below 256
    assert bool((tw.esc_ptr[200:] == tw.escapes).all()) and int(tw.esc_ptr[200]) > int(tw.esc_ptr[199])


def test_no_escape_one_unread_slot():
    w = torch.full((128, 64), 0.5, dtype=torch.bfloat16)
    tw = tile_weight(w)
    assert tw.escapes == 0 and tw.esc_row.shape == (1,) and bool((tw.esc_ptr == 0).all())
    assert torch.equal(_bits(tile_bits(tw)), _bits(w))


def test_a_record_slot_that_is_not_zero_where_an_escape_lands_is_refused():
    w = trained_like(128, 64, seed=4)
    w[2, 3] = 1e-39
    tw = tile_weight(w)
    tile = tile_bits(tw)
    tile.view(torch.int16)[2, 3] = 1
    with pytest.raises(ValueError, match="escaped slot"):
        with_escapes(tw, tile)


def test_a_matrix_with_raw_rows_has_no_tile_copy():
    w = trained_like(64, 128, seed=6)
    w[5] = random_bits(1, 128, seed=7)[0]  # a channel W12 stores raw
    assert tile_weight(w) is None


def test_the_copy_costs_what_the_records_cost():
    w = trained_like(256, 512, seed=8)
    tw = tile_weight(w)
    e = max(tw.escapes, 1)
    bits = 8 * tw.nbytes() / w.numel()  # records 12, the CSR 4 B a channel, 10 B an escape
    assert bits == pytest.approx(12 + 8 * (256 + 4 * (256 + 1) + 10 * e) / w.numel())
    assert bits < 12.1, bits


@pytest.mark.parametrize(("bn", "bk", "ok"), [(16, 64, True), (32, 128, True), (128, 128, True), (8, 64, False),
                                              (48, 64, False), (32, 96, False), (256, 64, False)])  # fmt: skip
def test_which_kernel_tiles_can_read_records(bn, bk, ok):
    assert (check_tile(bn, bk) is None) == ok


@pytest.mark.parametrize(("n", "band"), [(300, 128), (300, 256), (512, 128), (1034, 128), (129, 128)])
def test_encoding_in_row_bands_is_encoding_whole(n, band):
    """A large matrix is encoded a band of rows at a time (the encoder's temporaries are several
    times what it encodes): every part equals the whole matrix's encoding. 1034 rows: the last
    band's 10 rows carry 118 rows of padding and tip to raw rows alone, the whole does not; 129
    rows: the whole tips too (W12 stores it raw)."""
    w = with_specials(trained_like(n, 320, seed=n), seed=n)
    whole, banded = tile_weight(w), tile_weight(w, band_rows=band)
    if n == 129:
        assert whole is None and banded is None
        return
    assert whole.escapes > 0 and whole.shape == banded.shape
    for name in TileWeight.PARTS:
        a, b = getattr(whole, name), getattr(banded, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_a_band_with_raw_rows_makes_the_matrix_raw():
    w = trained_like(384, 64, seed=4)
    w[300, :20] = float("nan")  # more than one escape in eight: a raw row, in the third band
    assert tile_weight(w) is None and tile_weight(w, band_rows=128) is None


def test_bands_are_whole_record_bands_and_bad_matrices_one_clear_error():
    with pytest.raises(ValueError, match="multiple of 128"):
        tile_weight(trained_like(256, 64, seed=1), band_rows=100)
    with pytest.raises(W12FormatError, match="2-D bfloat16"):
        tile_weight(torch.zeros(3, dtype=torch.bfloat16))
    with pytest.raises(W12FormatError, match="2-D bfloat16"):
        tile_weight(torch.zeros(4, 64))
    with pytest.raises(W12FormatError, match="at least one row"):
        tile_weight(torch.zeros(0, 64, dtype=torch.bfloat16))
