"""W12 weight tiles (kernels/w12/tiles.py): the kernels' copy of a matrix rebuilds it bit for bit.

`tile_bits` is the fused kernels' arithmetic in torch (exact exponents, reserved codes as signed
zeros, escapes regrouped per record); the GPU test (tests/gpu/test_w12_entry_gpu.py) checks the
Triton tiles against it and the W12 pass against stock's, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from specpilot.kernels.w12.tiles import TileWeight, check_tile, tile_bits, tile_weight

from .w12_data import random_bits, trained_like, with_specials


def _bits(w: torch.Tensor) -> torch.Tensor:
    return w.view(torch.int16)


@pytest.mark.parametrize(("n", "k", "seed"), [(128, 64, 0), (230, 250, 1), (300, 1000, 2), (250, 640, 3)])
def test_tiles_rebuild_every_weight(n, k, seed):
    """Ragged edges, zeros of both signs, denormals, inf, NaN payloads and far outliers."""
    w = with_specials(trained_like(n, k, seed=seed), seed=seed)
    w[0, :3] = torch.tensor([0.0, -0.0, 1e-39])
    tw = tile_weight(w)
    assert isinstance(tw, TileWeight) and tw.esc.numel() > 0
    assert torch.equal(_bits(tile_bits(tw)), _bits(w))
    # every escape sits in its record's list, ordered by record
    counts = tw.eptr[1:] - tw.eptr[:-1]
    assert int(counts.sum()) == tw.esc.numel() and bool((counts >= 0).all())


def test_escapes_with_the_sign_bit_pack_into_int32():
    w = trained_like(128, 128, seed=5)
    w[3, 70] = -3e-20  # an escape whose bf16 bits have bit 15 set
    w[127, 127] = float("-inf")
    tw = tile_weight(w)
    assert tw.esc.dtype == torch.int32 and bool((tw.esc < 0).any())
    assert torch.equal(_bits(tile_bits(tw)), _bits(w))


def test_a_matrix_with_raw_rows_has_no_tile_copy():
    w = trained_like(64, 128, seed=6)
    w[5] = random_bits(1, 128, seed=7)[0]  # a channel W12 stores raw
    assert tile_weight(w) is None


def test_the_copy_costs_what_the_records_cost():
    w = trained_like(256, 512, seed=8)
    tw = tile_weight(w)
    bits = 8 * tw.nbytes() / w.numel()
    assert 12.0 < bits < 12.2, bits


@pytest.mark.parametrize(("bn", "bk", "ok"), [(16, 64, True), (32, 128, True), (128, 128, True),
                                              (48, 64, False), (32, 96, False), (256, 64, False)])  # fmt: skip
def test_which_kernel_tiles_can_read_records(bn, bk, ok):
    assert (check_tile(bn, bk) is None) == ok
