"""Triton side of W12 weight tiles (tiles.py says what a tile is and how escapes are added).

Two rebuilds give the same bits. USE_ASM (the GPU's): the record's bytes are read as int32 words
(four weights each) and rebuilt by inline PTX, two bf16 per 32-bit register:
    valid lanes   z = sign-replicate((V & 0x7F7F7F7F) + 0x7F7F7F7F)   (0xFFFF where mag != 0)
    sign, mag     p = (prmt(V) << 4) & 0x87F087F0                     (s << 15 | mag << 4)
    exponent      p += z & base2                                      (base = (E_n - 15) << 7)
    low nibble    out = p | (prmt(L) & 0x000F000F)
(mag << 4 + base = (E_n - 15 + off) << 7 | m3 << 4 < 2^15: no carry into the sign or the next
lane), 4.5 instructions a weight. Without it, plain Triton integer ops on each byte (the reference
the GPU tests hold the PTX to).
"""

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


# $2 view word, $3 low-plane word (shifted right 4 for the high half), $4 base2; $0, $1 the bf16
# pairs of columns (4j, 4j+1) and (4j+2, 4j+3).
_EXACT = """
    and.b32 t, $2, 0x7F7F7F7F;
    add.u32 t, t, 0x7F7F7F7F;
    prmt.b32 z0, t, 0, 0x9988;
    prmt.b32 z1, t, 0, 0xBBAA;
    prmt.b32 p0, $2, 0, 0x9180;
    prmt.b32 p1, $2, 0, 0xB3A2;
    shl.b32 p0, p0, 4;
    shl.b32 p1, p1, 4;
    and.b32 p0, p0, 0x87F087F0;
    and.b32 p1, p1, 0x87F087F0;
    and.b32 z0, z0, $4;
    and.b32 z1, z1, $4;
    add.u32 p0, p0, z0;
    add.u32 p1, p1, z1;
    prmt.b32 l0, h, 0, 0x4140;
    prmt.b32 l1, h, 0, 0x4342;
    lop3.b32 $0, p0, l0, 0x000F000F, 0xF8;
    lop3.b32 $1, p1, l1, 0x000F000F, 0xF8;
"""
ASM_LO = tl.constexpr("{ .reg .b32 t, z0, z1, p0, p1, l0, l1, h; mov.b32 h, $3;" + _EXACT + "}")
ASM_HI = tl.constexpr("{ .reg .b32 t, z0, z1, p0, p1, l0, l1, h; shr.u32 h, $3, 4;" + _EXACT + "}")


@triton.jit
def _pairs_to_bf16(a0, a1):
    """Two int32 [BN, 8] of bf16 pairs (k, k+1), (k+2, k+3) -> bf16 [BN, 32] in k order."""
    lo0 = a0.to(tl.int16).to(tl.bfloat16, bitcast=True)  # int32 -> int16 keeps the low half
    hi0 = (a0 >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    lo1 = a1.to(tl.int16).to(tl.bfloat16, bitcast=True)
    hi1 = (a1 >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    w = tl.join(tl.join(lo0, lo1), tl.join(hi0, hi1))  # [BN, 8, pair, half]: column 4j + 2 pair + half
    return tl.reshape(w, (w.shape[0], w.shape[1] * 4))


@triton.jit
def _cat(a, b):
    """[R, C] and [R, C] -> [R, 2C], a's columns first."""
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (a.shape[0], 2 * a.shape[1]))


@triton.jit
def _record(rec_ptr, base, r0, band, kr, KT: tl.constexpr, BN: tl.constexpr, USE_ASM: tl.constexpr):
    """bf16 [BN, 64]: local rows r0 .. r0 + BN - 1 of record (band, kr) (escaped slots +0); zeros past KT."""
    rec = band * KT + kr
    in_k = kr < KT
    r = r0 + tl.arange(0, BN)
    if USE_ASM:
        words = tl.arange(0, 8)
        live = (in_k & (r >= 0))[:, None] & (words >= 0)[None, :]
        p = rec_ptr.to(tl.pointer_type(tl.int32)) + rec.to(tl.int64) * 3072 + r[:, None] * 8 + words[None, :]
        v0 = tl.load(p, mask=live, other=0)
        v1 = tl.load(p + 1024, mask=live, other=0)
        lo = tl.load(p + 2048, mask=live, other=0)
        b2 = tl.broadcast_to((base | (base << 16))[:, None], v0.shape)
        a0, a1 = tl.inline_asm_elementwise(ASM_LO, "=r,=r,r,r,r", [v0, lo, b2], dtype=(tl.int32, tl.int32),
                                           is_pure=True, pack=1)  # fmt: skip
        w0 = _pairs_to_bf16(a0, a1)
        a0, a1 = tl.inline_asm_elementwise(ASM_HI, "=r,=r,r,r,r", [v1, lo, b2], dtype=(tl.int32, tl.int32),
                                           is_pure=True, pack=1)  # fmt: skip
        w1 = _pairs_to_bf16(a0, a1)
    else:
        c = tl.arange(0, 32)
        live = (in_k & (r >= 0))[:, None] & (c >= 0)[None, :]
        p = rec_ptr + rec.to(tl.int64) * 12288 + r[:, None] * 32 + c[None, :]
        v0 = tl.load(p, mask=live, other=0).to(tl.int32)
        v1 = tl.load(p + 4096, mask=live, other=0).to(tl.int32)
        lo = tl.load(p + 8192, mask=live, other=0).to(tl.int32)
        w0 = w12_bits(v0, lo & 15, base[:, None]).to(tl.int16).to(tl.bfloat16, bitcast=True)
        w1 = w12_bits(v1, lo >> 4, base[:, None]).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return _cat(w0, w1)


@triton.jit
def w12_tile(
    rec_ptr, base, n0, k0, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, USE_ASM: tl.constexpr = True
):
    """The bf16 tile W[n0 : n0 + BN, k0 : k0 + BK] of a [N, K] matrix, escaped slots +0 (zeros past
    its edges); base = w12_base(exps, n0, N, BN). BN | 128, n0 % BN == 0, BK 64 or 128."""
    tl.static_assert(128 % BN == 0 and BN >= 16, "W12 tiles: BN must divide 128 (16 at least)")
    tl.static_assert(BK == 64 or BK == 128, "W12 tiles: BK must be 64 or 128")
    KT: tl.constexpr = (K + 63) // 64
    r0 = n0 % 128
    band = n0 // 128
    w = _record(rec_ptr, base, r0, band, k0 // 64, KT, BN, USE_ASM)
    if BK == 128:
        w = _cat(w, _record(rec_ptr, base, r0, band, k0 // 64 + 1, KT, BN, USE_ASM))
    return w


@triton.jit
def w12_escapes(acc, esc_ptr, esc_row, esc_col, esc_bits, n0, a_ptr, rows, rmask, K: tl.constexpr):
    """acc [BM, BN], the fp32 sums of channels n0 .. n0 + BN - 1 over their tiles, plus each of their
    escapes' exact products a[row, col] · w[n, col] (a: bf16, row stride K), in list order."""
    cn = tl.arange(0, acc.shape[1])
    for e in range(tl.load(esc_ptr + n0), tl.load(esc_ptr + n0 + acc.shape[1])):
        col = tl.load(esc_col + e)
        av = tl.load(a_ptr + rows * K + col, mask=rmask, other=0.0).to(tl.float32)
        wv = tl.load(esc_bits + e).to(tl.bfloat16, bitcast=True).to(tl.float32)
        acc += tl.where(cn[None, :] == tl.load(esc_row + e) - n0, av[:, None] * wv, 0.0)
    return acc


@triton.jit
def w12_gemv(a_ptr, rec_ptr, exp_ptr, esc_ptr, esc_row, esc_col, esc_bits, n0, N, rows, rmask, K: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, USE_ASM: tl.constexpr = True):  # fmt: skip
    """fp32 [BM, BN]: a[rows] · W[n0 : n0 + BN]ᵀ of a [N, K] matrix from its TileWeight parts: a
    w12_tile dot a K step (a: bf16 [rows, K], row stride K, rows outside rmask read as 0), then
    w12_escapes. The refspec-w12 entry's kernels' GEMV."""
    base = w12_base(exp_ptr, n0, N, BN)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=rmask[:, None] & (ks < K)[None, :], other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        acc = tl.dot(a, tl.trans(w12_tile(rec_ptr, base, n0, k0, K, BN, BK, USE_ASM)), acc)
    return w12_escapes(acc, esc_ptr, esc_row, esc_col, esc_bits, n0, a_ptr, rows, rmask, K)
