"""W12 weight tiles for fused kernels: a bf16 tile rebuilt bit for bit from W12 records.

A kernel that multiplies a bf16 weight tile W[n0 : n0 + BN, k0 : k0 + BK] (rows are output
channels) can read W12 records instead and hand the very same tile to the same `tl.dot`: its
output keeps the bf16 kernel's bits, whatever the activations. Each weight is rebuilt with its
exact exponent (bits = s << 15 | (E_n - 15 + off) << 7 | m, no per-channel rescale, so no range
limit) and a reserved view code gives a zero of its sign. A tile needs BN | 128 with n0 a multiple
of BN, and BK = 64 or 128 with k0 a multiple of BK: it lies in one 128-row band of records and
covers BK / 64 whole records.

Escapes ride as patch rows: a record row (one channel's 64 columns of one record) that holds an
escape is also stored whole in bf16 (`patch`), and `pidx` names it (record i's row r is patch row
pinfo[i, 0] + pidx[i, r]; 255: none), so a tile takes a patched row from there with one masked load
and one select: no loop over escapes (a loop inside a kernel's K loop keeps Triton from pipelining
it). pinfo[i, 1] has bit g set when rows 16g .. 16g + 15 of record i hold a patched row, so a tile
whose rows hold none (nearly all: ~5 escapes in 10^5 weights touch ~0.4 of a record's 128 rows)
skips that work on one scalar test. pidx costs 1 byte a record row (+0.13 bit a weight), pinfo 8
bytes a record, the patch rows ~+0.05 bit a weight.

The kernels' part is tile_kernels.py (Triton, imported only where Triton is); this module is torch.
`tile_weight` makes the kernels' copy of a matrix (the records and window exponents as the codec
writes them, verified against the source bit for bit); a matrix with raw rows (format.py: a
channel with more than one escape in eight) has none: it returns None and the caller keeps bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .codec import encode, verify
from .format import RECORD_BYTES, TILE_K, TILE_N

TILE_BK = (64, 128)  # the K tiles a kernel may use
NO_PATCH = 255  # pidx of a record row that holds no escape


@dataclass
class TileWeight:
    """A weight matrix [N, K] as fused kernels read it (all on one device)."""

    shape: tuple[int, int]
    records: torch.Tensor  # uint8 [NT, KT, 12288], format.py's records
    exps: torch.Tensor  # uint8 [N], each channel's window top E_n
    pinfo: torch.Tensor  # int32 [NT * KT, 2]: record i's first patch row; bits: its 16-row groups holding one
    pidx: torch.Tensor  # uint8 [NT * KT, 128]: record i's row r is patch row pinfo[i, 0] + pidx[i, r], or 255
    patch: torch.Tensor  # int16 [max(P, 1), 64]: the bf16 bits of each patched record row (zero past K)

    PARTS = ("records", "exps", "pinfo", "pidx", "patch")

    @property
    def kt(self) -> int:
        return int(self.records.shape[1])

    def parts(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, p) for p in self.PARTS)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.parts())


def tile_weight(w: torch.Tensor) -> TileWeight | None:
    """The kernels' W12 copy of bf16 `w` [N, K] (on w's device), or None when W12 stores rows of it raw."""
    t = encode(w)
    verify(t, w)  # the records decode to w bit for bit, or W12FormatError
    if t.n_raw:
        return None
    n, k = t.shape
    nt, kt = t.records.shape[:2]
    dev = w.device
    counts = (t.esc_ptr[1:] - t.esc_ptr[:-1]).long()
    rows = torch.repeat_interleave(torch.arange(n, device=dev), counts)
    rec = (rows // TILE_N) * kt + t.esc_col.long() // TILE_K
    key = torch.unique(rec * TILE_N + rows % TILE_N)  # the patched (record, row) pairs, ascending
    prec, prow = key // TILE_N, key % TILE_N
    pcount = torch.bincount(prec, minlength=nt * kt)
    pbase = torch.zeros(nt * kt, dtype=torch.int64, device=dev)
    pbase[1:] = pcount.cumsum(0)[:-1]
    pidx = torch.full((nt * kt, TILE_N), NO_PATCH, dtype=torch.uint8, device=dev)
    pidx[prec, prow] = (torch.arange(key.numel(), device=dev) - pbase[prec]).to(torch.uint8)
    pinfo = torch.stack([pbase, _groups(prec, prow, nt * kt)], 1).to(torch.int32).contiguous()
    bits = F.pad(w.contiguous().view(torch.int16), (0, kt * TILE_K - k, 0, nt * TILE_N - n))
    ch = (prec // kt) * TILE_N + prow
    cols = (prec % kt)[:, None] * TILE_K + torch.arange(TILE_K, device=dev)[None, :]
    patch = bits[ch[:, None], cols] if key.numel() else torch.zeros(1, TILE_K, dtype=torch.int16, device=dev)
    return TileWeight((n, k), t.records, t.exps, pinfo, pidx, patch.contiguous())


def _groups(prec: torch.Tensor, prow: torch.Tensor, records: int) -> torch.Tensor:
    """Per record, bit g set when one of its rows 16g .. 16g + 15 is patched (int64)."""
    hit = torch.zeros(records, 8, dtype=torch.bool, device=prec.device)
    hit[prec, prow // 16] = True
    return (hit.long() << torch.arange(8, device=prec.device)).sum(1)


def tile_bits(tw: TileWeight) -> torch.Tensor:
    """The matrix [N, K] (bf16) that the kernels' tiles rebuild from `tw`, by the kernels' arithmetic
    in torch: w12_bits on every slot, then the patched record rows (the kernels' reference)."""
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
    prec, prow = (tw.pidx != NO_PATCH).nonzero(as_tuple=True)
    at = tw.pinfo[:, 0].long()[prec] + tw.pidx[prec, prow].long()
    if not torch.equal(tw.pinfo[:, 1].long(), _groups(prec, prow, nt * kt)):
        raise ValueError("TileWeight.pinfo's group bits do not name the groups pidx patches")
    ch = (prec // kt) * TILE_N + prow
    cols = (prec % kt)[:, None] * TILE_K + torch.arange(TILE_K, device=v.device)[None, :]
    bits[ch[:, None], cols] = tw.patch[at]
    return bits[: tw.shape[0], : tw.shape[1]].contiguous().view(torch.bfloat16)


def check_tile(bn: int, bk: int) -> str | None:
    """Why a kernel tile of BN rows and BK columns cannot read W12 records, or None if it can."""
    if TILE_N % bn:
        return f"its row tile {bn} does not divide the records' {TILE_N} rows"
    if bk not in TILE_BK:
        return f"its K tile {bk} is not one of {TILE_BK}"
    return None


assert RECORD_BYTES == 12288 and TILE_N == 128 and TILE_K == 64  # the constants tile_kernels.py spells out
