"""W12 weight tiles for fused kernels: bf16 tiles rebuilt from W12 records, escapes added after.

A kernel that multiplies a bf16 weight tile W[n0 : n0 + BN, k0 : k0 + BK] (rows are output
channels) can read W12 records instead: each weight is rebuilt in registers with its exact
exponent (bits = s << 15 | (E_n - 15 + off) << 7 | m, no per-channel rescale, so no range limit)
and handed to the same `tl.dot`. A reserved view code gives a zero of its sign, and an escaped
slot (format.py: a weight outside its channel's window, denormal, inf, NaN) is a +0 in the tile.
A tile needs BN | 128 with n0 a multiple of BN, and BK = 64 or 128 with k0 a multiple of BK: it
lies in one 128-row band of records and covers BK / 64 whole records.

Escapes are added after the K loop, the way the paper's W12 GEMM does: the program walks its
channels' escape lists (esc_ptr, a CSR over channels; ~8 escapes in 10^5 weights of a trained-like
matrix, ~12 for a 32-channel program of a 5120-wide layer) and adds each exact fp32 product
x[:, col] * w[n, col] to channel n's fp32 sum. Nothing about escapes sits inside the K loop, so
Triton pipelines it as it does stock's. Every weight is exact; the products are summed in another
order than one bf16 dot's, so the outputs are not a bf16 kernel's bit for bit (nor would they be
with every escape inside the tile: a dot fed from registers adds in another order than one fed
from a load, bench/w12_tile_ladder.py). One limit on non-finite activations: an escaped slot is
+0 in the tile, so an inf activation meets it as inf · 0 = NaN in the dot, where a bf16 GEMM
would multiply the escaped weight itself; finite activations get the exact products.

The kernels' part is tile_kernels.py (Triton, imported only where Triton is); this module is torch.
`tile_weight` makes the kernels' copy of a matrix (the records and window exponents as the codec
writes them, verified against the source bit for bit); a matrix with raw rows (format.py: a
channel with more than one escape in eight) has none: it returns None and the caller keeps bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .codec import encode, verify
from .format import RECORD_BYTES, TILE_K, TILE_N, W12FormatError

TILE_BK = (64, 128)  # the K tiles a kernel may use


@dataclass
class TileWeight:
    """A weight matrix [N, K] as fused kernels read it (all on one device)."""

    shape: tuple[int, int]
    records: torch.Tensor  # uint8 [NT, KT, 12288], format.py's records (an escaped slot reads +0)
    exps: torch.Tensor  # uint8 [N], each channel's window top E_n
    esc_ptr: torch.Tensor  # int32 [NT * 128 + 1]: channel n's escapes are [esc_ptr[n], esc_ptr[n + 1])
    esc_row: torch.Tensor  # int32 [max(E, 1)]: each escape's channel
    esc_col: torch.Tensor  # int32 [max(E, 1)]: its column
    esc_bits: torch.Tensor  # int16 [max(E, 1)]: its exact bf16 bits

    PARTS = ("records", "exps", "esc_ptr", "esc_row", "esc_col", "esc_bits")

    @property
    def kt(self) -> int:
        return int(self.records.shape[1])

    @property
    def escapes(self) -> int:
        return int(self.esc_ptr[-1])

    def parts(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, p) for p in self.PARTS)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.parts())


def tile_weight(w: torch.Tensor, band_rows: int = 8192) -> TileWeight | None:
    """The kernels' W12 copy of bf16 `w` [N, K] (on w's device), or None when W12 stores rows of it raw.

    Encoded and verified `band_rows` rows at a time (a multiple of the records' 128-row bands; the
    encoder and its bit-for-bit check hold several times what they encode). Channels and record
    bands are encoded independently, so every part is the whole matrix's encoding, but for the
    choice of raw rows (format.py): where the whole's tile padding tips a split to raw rows, the
    last band, which holds that padding, tips too. So a band with raw rows sends the matrix to
    the one-band encoding, whose answer is the whole's (a matrix with raw rows is rare)."""
    if band_rows <= 0 or band_rows % TILE_N:
        raise ValueError(f"band_rows {band_rows} must be a positive multiple of {TILE_N}")
    if w.dim() != 2 or w.dtype != torch.bfloat16:
        encode(w)  # its one error: W12 encodes 2-D bf16
    n, k = w.shape
    if not n or not k:
        raise W12FormatError(f"W12 tiles hold a matrix of at least one row and column, got {tuple(w.shape)}")
    dev = w.device
    records = exps = None
    ptrs, cols, bits = [], [], []
    for r0 in range(0, n, band_rows):
        part = w[r0 : r0 + band_rows]
        t = encode(part)
        verify(t, part)  # the records and escape lists decode to the band bit for bit, or W12FormatError
        if t.n_raw:
            return None if n <= band_rows else tile_weight(w, band_rows=-(-n // TILE_N) * TILE_N)
        if records is None:
            records = torch.empty((-(-n // TILE_N), *t.records.shape[1:]), dtype=t.records.dtype, device=dev)
            exps = torch.empty(n, dtype=t.exps.dtype, device=dev)
        records[r0 // TILE_N : r0 // TILE_N + t.records.shape[0]] = t.records
        exps[r0 : r0 + part.shape[0]] = t.exps
        ptrs.append(t.esc_ptr[1:].long() + (int(ptrs[-1][-1]) if ptrs else 0))
        cols.append(t.esc_col.to(torch.int32))
        bits.append(t.esc_bits)
        del t
    e = int(ptrs[-1][-1])
    ptr = torch.full(
        (records.shape[0] * TILE_N + 1,), e, dtype=torch.int32, device=dev
    )  # channels past N: none
    ptr[0] = 0
    ptr[1 : n + 1] = torch.cat(ptrs)
    counts = (ptr[1 : n + 1] - ptr[:n]).long()
    row = torch.repeat_interleave(torch.arange(n, device=dev, dtype=torch.int32), counts)
    one = lambda x, dt: x.to(dt) if e else torch.zeros(1, dtype=dt, device=dev)  # never read when E = 0
    return TileWeight((n, k), records, exps, ptr, one(row, torch.int32), one(torch.cat(cols), torch.int32),
                      one(torch.cat(bits), torch.int16))  # fmt: skip


def tile_bits(tw: TileWeight) -> torch.Tensor:
    """The matrix [N, K] (bf16) the kernels' tiles rebuild from `tw`, by the kernels' arithmetic in
    torch (w12_bits on every slot; an escaped slot is +0): the dot's operand, escapes not in it."""
    nt, kt = tw.records.shape[:2]
    rec = tw.records.int()
    v = rec[:, :, : 2 * 4096].reshape(nt, kt, 2, TILE_N, 32)
    lb = rec[:, :, 2 * 4096 :].reshape(nt, kt, TILE_N, 32)
    low = torch.stack([lb & 15, lb >> 4], dim=2)
    rows = lambda x: x.permute(0, 3, 1, 2, 4).reshape(nt * TILE_N, kt * TILE_K)
    v, low = rows(v), rows(low)
    base = torch.zeros(nt * TILE_N, 1, dtype=torch.int32, device=v.device)
    base[: tw.shape[0], 0] = (tw.exps.int() - 15) << 7
    sign = (v & 0x80) << 8
    bits = torch.where((v & 0x7F) != 0, sign | (((v & 0x7F) << 4) + base) | low, sign)
    bits = torch.where(bits >= 1 << 15, bits - (1 << 16), bits).to(torch.int16)
    return bits[: tw.shape[0], : tw.shape[1]].contiguous().view(torch.bfloat16)


def with_escapes(tw: TileWeight, tile: torch.Tensor) -> torch.Tensor:
    """`tile` (tile_bits(tw)) with each escape put back in its slot: the matrix tw encodes."""
    out = tile.clone().view(torch.int16)
    if tw.escapes:
        e = tw.escapes
        if bool((out[tw.esc_row[:e].long(), tw.esc_col[:e].long()] != 0).any()):
            raise ValueError("TileWeight: an escaped slot of the records is not +0")
        out[tw.esc_row[:e].long(), tw.esc_col[:e].long()] = tw.esc_bits[:e]
    return out.view(torch.bfloat16)


def check_tile(bn: int, bk: int) -> str | None:
    """Why a kernel tile of BN rows and BK columns cannot read W12 records, or None if it can."""
    if TILE_N % bn or bn < 16:
        return f"its row tile {bn} does not divide the records' {TILE_N} rows or is under 16 (a dot's least)"
    if bk not in TILE_BK:
        return f"its K tile {bk} is not one of {TILE_BK}"
    return None


assert RECORD_BYTES == 12288 and TILE_N == 128 and TILE_K == 64  # the constants tile_kernels.py spells out
