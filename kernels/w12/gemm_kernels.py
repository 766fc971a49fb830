"""Triton kernels of the W12 GEMM y = x W^T (exact pass) and of the Q pass (8-bit view).

Swap-AB: each program computes acc[BN rows of W, BM rows of x] = W_tile @ x_tile^T, so the rebuilt
weight tile is the register operand A of the tensor-core dot (wgmma on Hopper) and the small
activation tile is operand B. A record's two 4 KB view chunks hold columns 0..31 and 32..63; the
4 KB low chunk holds both halves' nibbles in one byte, so every step is two K=32 dots.

The rebuild works on bit patterns: bf16 bits = s << 15 | (112 + off) << 7 | m (see format.py).
On the GPU it is inline PTX on four weights at a time (two bf16 pairs per 32-bit register):
    valid byte mask   z = sign-replicate((V & 0x7F7F7F7F) + 0x7F7F7F7F) & 0x38383838
    sign-extended     p = prmt(V) << 4      -> bit 15 = s, bits 4..10 = off, m >> 4
    nibble + exponent q = prmt(L, z)        -> bits 11..13 = 0b111 if valid, bits 0..3 = l
    bf16 pair         lop3 mux(p, q, 0x87F087F0)
so a reserved (escaped) slot, whose view byte has low 7 bits 0 and whose nibble is 0, rebuilds to
+-0 with no select. The interpreter cannot run inline PTX, so USE_ASM=False does the same
arithmetic with plain Triton integer ops (the CPU tests run that path; the GPU tests compare both).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tile_kernels import _pairs_to_bf16  # the same pairs -> bf16 step as the fused kernels' tiles

_VALID = """
    and.b32 t, $2, 0x7F7F7F7F;
    add.u32 t, t, 0x7F7F7F7F;
    prmt.b32 z, t, 0, 0xBA98;
    prmt.b32 p0, $2, 0, 0x9180;
    prmt.b32 p1, $2, 0, 0xB3A2;
    shl.b32 p0, p0, 4;
    shl.b32 p1, p1, 4;
"""
_MUX = """
    lop3.b32 $0, p0, q0, 0x87F087F0, 0xE4;
    lop3.b32 $1, p1, q1, 0x87F087F0, 0xE4;
"""
ASM_LO = tl.constexpr(
    "{ .reg .b32 t, z, p0, p1, q0, q1;"
    + _VALID
    + """
    and.b32 z, z, 0x38383838;
    prmt.b32 q0, $3, z, 0x5140;
    prmt.b32 q1, $3, z, 0x7362;
"""
    + _MUX
    + "}"
)
ASM_HI = tl.constexpr(
    "{ .reg .b32 t, z, p0, p1, q0, q1, h;"
    + _VALID
    + """
    and.b32 z, z, 0x38383838;
    shr.u32 h, $3, 4;
    prmt.b32 q0, h, z, 0x5140;
    prmt.b32 q1, h, z, 0x7362;
"""
    + _MUX
    + "}"
)
# Q pass: the low nibble is the midpoint 0b1000 for valid slots (0 for escaped ones).
ASM_Q = tl.constexpr(
    "{ .reg .b32 t, z, p0, p1, q0, q1, h;"
    + _VALID
    + """
    and.b32 h, z, 0x08080808;
    and.b32 z, z, 0x38383838;
    prmt.b32 q0, h, z, 0x5140;
    prmt.b32 q1, h, z, 0x7362;
"""
    + _MUX
    + "}"
)


@triton.jit
def _lane(v, lo, i: tl.constexpr, HI: tl.constexpr, QPASS: tl.constexpr):
    """Byte lane i of the packed words: view byte and low nibble -> bf16 bits (int32)."""
    vb = (v >> (8 * i)) & 0xFF
    if QPASS:
        low = 8
    elif HI:
        low = (lo >> (8 * i + 4)) & 0xF
    else:
        low = (lo >> (8 * i)) & 0xF
    bits = ((vb & 0x80) << 8) | ((vb & 0x7F) << 4) | low | 0x3800
    return tl.where((vb & 0x7F) != 0, bits, 0)


@triton.jit
def rebuild(v, lo, HI: tl.constexpr, QPASS: tl.constexpr, USE_ASM: tl.constexpr):
    """v, lo: int32 [BN, 8], four view / low-plane bytes each (byte i = column 4j + i).

    Returns bf16 [BN, 32], the weights scaled as described in format.py.
    """
    if USE_ASM:
        if QPASS:
            a0, a1 = tl.inline_asm_elementwise(
                ASM_Q, "=r,=r,r", [v], dtype=(tl.int32, tl.int32), is_pure=True, pack=1
            )
        elif HI:
            a0, a1 = tl.inline_asm_elementwise(
                ASM_HI, "=r,=r,r,r", [v, lo], dtype=(tl.int32, tl.int32), is_pure=True, pack=1
            )
        else:
            a0, a1 = tl.inline_asm_elementwise(
                ASM_LO, "=r,=r,r,r", [v, lo], dtype=(tl.int32, tl.int32), is_pure=True, pack=1
            )
    else:
        a0 = _lane(v, lo, 0, HI, QPASS) | (_lane(v, lo, 1, HI, QPASS) << 16)
        a1 = _lane(v, lo, 2, HI, QPASS) | (_lane(v, lo, 3, HI, QPASS) << 16)
    return _pairs_to_bf16(a0, a1)


@triton.jit
def _dot(w, xt, acc, DOT_F32: tl.constexpr):
    """Tensor-core dot; DOT_F32 (interpreter only) upcasts first: the same exact products, because
    Triton 3.9's interpreter computes bf16 dots wrongly."""
    if DOT_F32:
        return tl.dot(w.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(w, xt, acc)


@triton.jit
def _esc_load(start, count, j, esc_col, esc_bits):
    """The j-th escape of each row (masked where a row has fewer): (present, column, fp32 value)."""
    has = j < count
    col = tl.load(esc_col + start + j, mask=has, other=0).to(tl.int32)
    val = tl.load(esc_bits + start + j, mask=has, other=0).to(tl.bfloat16, bitcast=True).to(tl.float32)
    return has, col, val


@triton.jit
def _esc_term(e, has, col, val, ms, mmask, x, stride_xm):
    """e + val * x[m, col] where the escape is present (products of bf16 are exact in fp32)."""
    xv = tl.load(x + ms[None, :] * stride_xm + col[:, None], mask=has[:, None] & mmask[None, :], other=0.0)
    return tl.where(has[:, None], e + val[:, None] * xv.to(tl.float32), e)


@triton.jit
def escape_sum(n0, m0, M, N, x, stride_xm, esc_ptr, esc_col, esc_bits, BN: tl.constexpr, BM: tl.constexpr):
    """e[n, m] = sum of channel n's escapes w * x[m, col], added from 0.0 in escape-list order.

    The first four escapes of every row are loaded at once (two memory round trips in all); rows
    with more continue one escape at a time."""
    rows = n0 + tl.arange(0, BN)
    ms = m0 + tl.arange(0, BM)
    rmask = rows < N
    mmask = ms < M
    start = tl.load(esc_ptr + rows, mask=rmask, other=0)
    count = tl.load(esc_ptr + rows + 1, mask=rmask, other=0) - start
    h0, c0, v0 = _esc_load(start, count, 0, esc_col, esc_bits)
    h1, c1, v1 = _esc_load(start, count, 1, esc_col, esc_bits)
    h2, c2, v2 = _esc_load(start, count, 2, esc_col, esc_bits)
    h3, c3, v3 = _esc_load(start, count, 3, esc_col, esc_bits)
    e = tl.zeros((BN, BM), dtype=tl.float32)
    e = _esc_term(e, h0, c0, v0, ms, mmask, x, stride_xm)
    e = _esc_term(e, h1, c1, v1, ms, mmask, x, stride_xm)
    e = _esc_term(e, h2, c2, v2, ms, mmask, x, stride_xm)
    e = _esc_term(e, h3, c3, v3, ms, mmask, x, stride_xm)
    for j in range(4, tl.max(count, axis=0)):
        hj, cj, vj = _esc_load(start, count, j, esc_col, esc_bits)
        e = _esc_term(e, hj, cj, vj, ms, mmask, x, stride_xm)
    return e


@triton.jit
def finish_tile(
    acc, e, n0, m0, M, N, out, stride_om, exps, bias,
    BN: tl.constexpr, BM: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    """y = acc * 2^(E_n - 127) + e (the escapes) + bias, rounded once to the output dtype."""
    rows = n0 + tl.arange(0, BN)
    ms = m0 + tl.arange(0, BM)
    rmask = rows < N
    mmask = ms < M
    en = tl.load(exps + rows, mask=rmask, other=127).to(tl.int32)
    y = acc * (en << 23).to(tl.float32, bitcast=True)[:, None] + e  # fp32 with exponent field E_n
    if HAS_BIAS:
        y += tl.load(bias + rows, mask=rmask, other=0.0).to(tl.float32)[:, None]
    optr = out + ms[None, :] * stride_om + rows[:, None]
    tl.store(optr, y.to(out.dtype.element_ty), mask=rmask[:, None] & mmask[None, :])


@triton.jit
def _record(p, chunk, left, MASKED: tl.constexpr, QPASS: tl.constexpr, USE_ASM: tl.constexpr):
    """One record's rows (p: its first int32 word; chunk: row/word offsets) -> bf16 [BN, 64].

    With MASKED, `left` <= 0 (a record past the split's end) loads zeros: zero weights."""
    if MASKED:
        mask = chunk < 1024 * left  # chunk < 1024: all true while a record is left
        v0 = tl.load(p + chunk, mask=mask, other=0)
        v1 = tl.load(p + 1024 + chunk, mask=mask, other=0)
        lo = v0 if QPASS else tl.load(p + 2048 + chunk, mask=mask, other=0)
    else:
        v0 = tl.load(p + chunk)
        v1 = tl.load(p + 1024 + chunk)
        lo = v0 if QPASS else tl.load(p + 2048 + chunk)
    w = tl.join(rebuild(v0, lo, False, QPASS, USE_ASM), rebuild(v1, lo, True, QPASS, USE_ASM))
    return _cat_k(w)


@triton.jit
def _cat_k(w):
    """[BN, K, 2] (last dim: first / second K block) -> [BN, 2K], the second block after the first."""
    return tl.reshape(tl.permute(w, (0, 2, 1)), (w.shape[0], 2 * w.shape[1]))


# M and KSPLIT vary per call; specializing on them (== 1, % 16) would only multiply the compiles.
@triton.jit(do_not_specialize=["M", "KSPLIT"])
def w12_gemm_kernel(
    rec, x, out, part, exps, esc_ptr, esc_col, esc_bits, bias,
    M, N, K, KT, KSPLIT, stride_xm, stride_om,
    BN: tl.constexpr, BM: tl.constexpr, FINISH: tl.constexpr, HAS_BIAS: tl.constexpr,
    QPASS: tl.constexpr, USE_ASM: tl.constexpr, NUM_STAGES: tl.constexpr, DOT_F32: tl.constexpr,
    XA: tl.constexpr, RPI: tl.constexpr,
):  # fmt: skip
    """One (row block, K split, M block): acc = sum over its records of W_tile x_tile^T.

    RPI records (RPI * 64 columns) make one dot per loop step. XA=False: acc[BN, BM] = W x^T with
    the rebuilt W as operand A; XA=True: acc[BM, BN] = x W^T with W as operand B (shared memory).
    FINISH (one split) finishes the tile here; otherwise the fp32 partial goes to part[split, m, n]
    and w12_reduce_kernel adds the splits in order 0, 1, ... (a fixed order: same bits every run).
    """
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    m0 = tl.program_id(2) * BM
    n0 = pid_n * BN
    rows = tl.arange(0, BN)
    ms = m0 + tl.arange(0, BM)
    words = tl.arange(0, 8)
    chunk = (n0 % 128 + rows)[:, None] * 8 + words[None, :]  # int32 offsets inside one 4 KB chunk
    base = rec.to(tl.pointer_type(tl.int32)) + (n0 // 128).to(tl.int64) * KT * 3072
    k_lo = split * KSPLIT
    k_hi = tl.minimum(k_lo + KSPLIT, KT)
    if FINISH:  # the escape sum first: its loads overlap the pipeline's first record loads
        e = escape_sum(n0, m0, M, N, x, stride_xm, esc_ptr, esc_col, esc_bits, BN, BM)
    else:  # noqa: SIM102 (a constexpr test, then a runtime one)
        if split == 0:  # the escape sum goes to the last partial slot; the loop hides its latency
            e = escape_sum(n0, m0, M, N, x, stride_xm, esc_ptr, esc_col, esc_bits, BN, BM)
            rr = n0 + rows
            eptr = part + tl.num_programs(1) * M * N + ms[None, :] * N + rr[:, None]
            tl.store(eptr, e, mask=(ms[None, :] < M) & (rr[:, None] < N))
    kk = tl.arange(0, 64 * RPI)
    if XA:  # noqa: SIM108
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    else:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    for kt in tl.range(k_lo, k_hi, RPI, num_stages=NUM_STAGES):
        p = base + kt * 3072  # a record is 3072 int32 words
        w = _record(p, chunk, 1, False, QPASS, USE_ASM)
        if RPI == 2:
            w = _cat_k(tl.join(w, _record(p + 3072, chunk, k_hi - kt - 1, True, QPASS, USE_ASM)))
        k = kt * 64 + kk
        kmask = (k < K) & (k < k_hi * 64)
        if XA:
            xt = tl.load(
                x + ms[:, None] * stride_xm + k[None, :], mask=(ms[:, None] < M) & kmask[None, :], other=0.0
            )
            acc = _dot(xt, tl.trans(w), acc, DOT_F32)
        else:
            xt = tl.load(
                x + ms[None, :] * stride_xm + k[:, None], mask=(ms[None, :] < M) & kmask[:, None], other=0.0
            )
            acc = _dot(w, xt, acc, DOT_F32)
    if XA:
        acc = tl.trans(acc)  # [BN, BM], once per program
    if FINISH:
        finish_tile(acc, e, n0, m0, M, N, out, stride_om, exps, bias, BN, BM, HAS_BIAS)
    else:
        rr = n0 + rows
        pptr = part + split * M * N + ms[None, :] * N + rr[:, None]
        tl.store(pptr, acc, mask=(ms[None, :] < M) & (rr[:, None] < N))


@triton.jit(do_not_specialize=["M"])
def w12_reduce_kernel(
    part,
    x,
    out,
    exps,
    esc_ptr,
    esc_col,
    esc_bits,
    bias,
    M,
    N,
    stride_xm,
    stride_om,
    BN: tl.constexpr,
    BM: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Sum the SPLIT fp32 partials of a tile in order 0..SPLIT-1, then finish it with the escape
    sum that split 0 left in slot SPLIT."""
    n0 = tl.program_id(0) * BN
    m0 = tl.program_id(1) * BM
    rr = n0 + tl.arange(0, BN)
    ms = m0 + tl.arange(0, BM)
    mask = (ms[None, :] < M) & (rr[:, None] < N)
    ptr = part + ms[None, :] * N + rr[:, None]
    acc = tl.load(ptr, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(ptr + s * M * N, mask=mask, other=0.0)
    e = tl.load(ptr + SPLIT * M * N, mask=mask, other=0.0)
    finish_tile(acc, e, n0, m0, M, N, out, stride_om, exps, bias, BN, BM, HAS_BIAS)
