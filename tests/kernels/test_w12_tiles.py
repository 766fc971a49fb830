"""W12 weight tiles (kernels/w12/tiles.py): the kernels' copy of a matrix rebuilds it bit for bit.

`tile_bits` is the fused kernels' arithmetic in torch (exact exponents, reserved codes as signed
zeros, the record rows that hold escapes taken whole from the patch rows); the GPU test (tests/gpu/test_w12_entry_gpu.py) checks the
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
    assert isinstance(tw, TileWeight) and tw.patch.shape[0] > 0
    assert torch.equal(_bits(tile_bits(tw)), _bits(w))
    # each record's patch rows are numbered from its pbase, in row order
    for i in range(tw.pidx.shape[0]):
        local = tw.pidx[i][tw.pidx[i] != 255].long()
        assert local.tolist() == list(range(local.numel()))
        assert i + 1 == tw.pidx.shape[0] or int(tw.pinfo[i + 1, 0]) == int(tw.pinfo[i, 0]) + local.numel()


def test_a_patch_row_is_the_record_row_whole():
    w = trained_like(256, 128, seed=5)
    w[3, 70] = -3e-20  # an escape: record (0, 1), row 3
    w[130, 5] = float("-inf")  # record (1, 0), row 2
    tw = tile_weight(w)
    rec, row = 1, 3  # record index nt * KT + kt with KT = 2
    at = int(tw.pinfo[rec, 0]) + int(tw.pidx[rec, row])
    assert torch.equal(tw.patch[at], _bits(w[3, 64:128]))
    at = int(tw.pinfo[2, 0]) + int(tw.pidx[2, 2])
    assert torch.equal(tw.patch[at], _bits(w[130, :64]))
    assert int(tw.pinfo[1, 1]) & 1 and int(tw.pinfo[2, 1]) & 1  # rows 3 and 2: group 0
    assert torch.equal(_bits(tile_bits(tw)), _bits(w))


def test_no_escape_no_patch_rows():
    w = torch.full((128, 64), 0.5, dtype=torch.bfloat16)
    tw = tile_weight(w)
    assert bool((tw.pidx == 255).all()) and tw.patch.shape == (1, 64)  # one zero row: never read
    assert torch.equal(_bits(tile_bits(tw)), _bits(w))


def test_a_matrix_with_raw_rows_has_no_tile_copy():
    w = trained_like(64, 128, seed=6)
    w[5] = random_bits(1, 128, seed=7)[0]  # a channel W12 stores raw
    assert tile_weight(w) is None


def test_the_copy_costs_what_the_records_cost():
    w = trained_like(256, 512, seed=8)
    tw = tile_weight(w)
    bits = 8 * tw.nbytes() / w.numel()  # records 12, pidx 0.125, patch rows 16 * 64 per escaped row
    escaped_rows = tw.patch.shape[0]
    assert bits == pytest.approx(
        12 + 0.125 + (escaped_rows * 64 * 16 + 8 * 4 * tw.pinfo.numel() + 8 * 256) / w.numel()
    )
    assert bits < 12.4, bits


@pytest.mark.parametrize(("bn", "bk", "ok"), [(16, 64, True), (32, 128, True), (128, 128, True),
                                              (48, 64, False), (32, 96, False), (256, 64, False)])  # fmt: skip
def test_which_kernel_tiles_can_read_records(bn, bk, ok):
    assert (check_tile(bn, bk) is None) == ok
