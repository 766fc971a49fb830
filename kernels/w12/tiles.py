"""W12 weight tiles for fused kernels: a bf16 tile rebuilt bit for bit from W12 records.

A kernel that multiplies a bf16 weight tile W[n0 : n0 + BN, k0 : k0 + BK] (rows are output
channels) can read W12 records instead and hand the very same tile to the same `tl.dot`: its
output keeps the bf16 kernel's bits, whatever the activations. Each weight is rebuilt with its
exact exponent (bits = s << 15 | (E_n - 15 + off) << 7 | m, no per-channel rescale, so no range
limit), a reserved view code gives a zero of its sign, and the record's escapes are put in their
places. A tile needs BN | 128 with n0 a multiple of BN, and BK = 64 or 128 with k0 a multiple of
BK: it lies in one 128-row band of records and covers BK / 64 whole records.

The kernels' part is tile_kernels.py (Triton, imported only where Triton is); this module is torch.

`tile_weight` makes the kernel's copy of a matrix: the W12 records and window exponents as the
codec writes them (verified against the source, bit for bit) and the escapes regrouped per record,
`eptr` (an index per record) and `esc` (int32, local row | local column << 7 | bf16 bits << 16),
so a tile scans only its records' lists, which are nearly always empty. A matrix with raw rows
(format.py: a channel with more than one escape in eight) has no such copy: `tile_weight` returns
None and the caller keeps the bf16 matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .codec import encode, verify
from .format import RECORD_BYTES, TILE_K, TILE_N

TILE_BK = (64, 128)  # the K tiles a kernel may use


@dataclass
class TileWeight:
    """A weight matrix [N, K] as fused kernels read it (all on one device)."""

    shape: tuple[int, int]
    records: torch.Tensor  # uint8 [NT, KT, 12288], format.py's records
    exps: torch.Tensor  # uint8 [N], each channel's window top E_n
    eptr: torch.Tensor  # int32 [NT * KT + 1]: record i's escapes are esc[eptr[i]:eptr[i + 1]]
    esc: torch.Tensor  # int32 [E]: local row | local column << 7 | bf16 bits << 16

    @property
    def kt(self) -> int:
        return int(self.records.shape[1])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.records, self.exps, self.eptr, self.esc))


def tile_weight(w: torch.Tensor) -> TileWeight | None:
    """The kernels' W12 copy of bf16 `w` [N, K] (on w's device), or None when W12 stores rows of it raw."""
    t = encode(w)
    verify(t, w)  # the records decode to w bit for bit, or W12FormatError
    if t.n_raw:
        return None
    n, _ = t.shape
    nt, kt = t.records.shape[:2]
    counts = (t.esc_ptr[1:] - t.esc_ptr[:-1]).long()
    rows = torch.repeat_interleave(torch.arange(n, device=w.device), counts)
    cols = t.esc_col.long()
    rec = (rows // TILE_N) * kt + cols // TILE_K
    order = torch.argsort(rec, stable=True)
    bits = t.esc_bits.long() & 0xFFFF
    packed = (rows % TILE_N) | ((cols % TILE_K) << 7) | (bits << 16)
    packed = torch.where(packed >= 1 << 31, packed - (1 << 32), packed)  # int32's two's complement
    eptr = torch.zeros(nt * kt + 1, dtype=torch.int32, device=w.device)
    eptr[1:] = torch.bincount(rec, minlength=nt * kt).cumsum(0)
    return TileWeight((n, w.shape[1]), t.records, t.exps, eptr, packed[order].to(torch.int32).contiguous())


def tile_bits(tw: TileWeight) -> torch.Tensor:
    """The matrix [N, K] (bf16) that the kernels' tiles rebuild from `tw`, by the kernels' arithmetic
    in torch: w12_bits on every slot, then each record's escapes put in (the kernels' reference)."""
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
    counts = (tw.eptr[1:] - tw.eptr[:-1]).long()
    rec_of = torch.repeat_interleave(torch.arange(nt * kt, device=v.device), counts)
    d = tw.esc.long() & 0xFFFFFFFF
    r = (rec_of // kt) * TILE_N + (d & 127)
    c = (rec_of % kt) * TILE_K + ((d >> 7) & 63)
    bits[r, c] = ((d >> 16) & 0xFFFF).int()
    out = bits[: tw.shape[0], : tw.shape[1]]
    return torch.where(out >= 1 << 15, out - (1 << 16), out).to(torch.int16).view(torch.bfloat16)


def check_tile(bn: int, bk: int) -> str | None:
    """Why a kernel tile of BN rows and BK columns cannot read W12 records, or None if it can."""
    if TILE_N % bn:
        return f"its row tile {bn} does not divide the records' {TILE_N} rows"
    if bk not in TILE_BK:
        return f"its K tile {bk} is not one of {TILE_BK}"
    return None


assert RECORD_BYTES == 12288 and TILE_N == 128 and TILE_K == 64  # the constants tile_kernels.py spells out
