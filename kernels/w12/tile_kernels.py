"""Triton side of W12 weight tiles (tiles.py says what a tile is and how the escapes are held)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def w12_bits(v, low, base):
    """int32 view bytes and low nibbles of a channel's weights, base = (E_n - 15) << 7: the exact
    bf16 bits (int32). A reserved code (low 7 view bits zero: zeros and escape slots) is a signed zero."""
    sign = (v & 0x80) << 8
    mag = v & 0x7F
    return tl.where(mag != 0, sign | ((mag << 4) + base) | low, sign)


@triton.jit
def w12_base(exp_ptr, n0, N, BN: tl.constexpr):
    """base = (E_n - 15) << 7 of channels n0 .. n0 + BN - 1 (channels past N: 0; their records are zero)."""
    n = n0 + tl.arange(0, BN)
    e = tl.load(exp_ptr + n, mask=n < N, other=15).to(tl.int32)
    return (e - 15) << 7


@triton.jit
def _cat(a, b):
    """[R, C] and [R, C] -> [R, 2C], a's columns first."""
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (a.shape[0], 2 * a.shape[1]))


@triton.jit
def _record(rec_ptr, eptr_ptr, esc_ptr, base, r, band, kr, KT: tl.constexpr, BN: tl.constexpr):
    """Bits (int32 [BN, 64]) of local rows r of record (band, kr), escapes in; zeros past KT."""
    live = (kr < KT) & (r >= 0)
    rec = band * KT + kr
    c = tl.arange(0, 32)
    p = rec_ptr + rec.to(tl.int64) * 12288 + r[:, None] * 32 + c[None, :]
    v0 = tl.load(p, mask=live[:, None], other=0).to(tl.int32)
    v1 = tl.load(p + 4096, mask=live[:, None], other=0).to(tl.int32)
    lo = tl.load(p + 8192, mask=live[:, None], other=0).to(tl.int32)
    w0 = w12_bits(v0, lo & 15, base[:, None])
    w1 = w12_bits(v1, lo >> 4, base[:, None])
    e0 = tl.load(eptr_ptr + rec, mask=kr < KT, other=0)
    e1 = tl.load(eptr_ptr + rec + 1, mask=kr < KT, other=0)
    for e in range(e0, e1):
        d = tl.load(esc_ptr + e)
        at = r[:, None] == (d & 127)
        col = (d >> 7) & 63
        bits = (d >> 16) & 0xFFFF
        w0 = tl.where(at & (c[None, :] == col), bits, w0)
        w1 = tl.where(at & (c[None, :] + 32 == col), bits, w1)
    return _cat(w0, w1)


@triton.jit
def w12_tile(rec_ptr, eptr_ptr, esc_ptr, base, n0, k0, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """The bf16 tile W[n0 : n0 + BN, k0 : k0 + BK] of a [N, K] matrix (zeros past its edges), from
    its TileWeight parts; base = w12_base(exps, n0, N, BN). BN | 128, n0 % BN == 0, BK 64 or 128."""
    tl.static_assert(128 % BN == 0, "W12 tiles: BN must divide 128")
    tl.static_assert(BK == 64 or BK == 128, "W12 tiles: BK must be 64 or 128")
    KT: tl.constexpr = (K + 63) // 64
    r = n0 % 128 + tl.arange(0, BN)
    band = n0 // 128
    w = _record(rec_ptr, eptr_ptr, esc_ptr, base, r, band, k0 // 64, KT, BN)
    if BK == 128:
        w = _cat(w, _record(rec_ptr, eptr_ptr, esc_ptr, base, r, band, k0 // 64 + 1, KT, BN))
    return w.to(tl.int16).to(tl.bfloat16, bitcast=True)
