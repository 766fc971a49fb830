"""Gluon (Hopper) kernel of the W12 GEMM exact pass: the rebuilt W tile is wgmma's register operand A.

acc[BN rows of W, BMN rows of x] = W_tile x_tile^T, one warpgroup per program. Each thread loads
exactly the record bytes of its own wgmma A fragments (8 contiguous bytes per row and chunk), so
the rebuilt bf16 pairs are the fragment registers: no shared-memory staging, no shuffles. This
works because a dot product does not care in which order it visits K: inside a record the kernel
visits the 64 columns in the order that puts each thread's fragment columns next to each other in
the record, and gathers x's columns in the same order.

    A-fragment column of a thread (lane bits c = lane % 4; register bits e, h, kb):
        logical k = 16 kb + 8 h + 2 c + e            (the wgmma k16 fragment, kb = 0..3)
    record column (format.py's row-major 4 KB chunks, LO = columns 0..31, HI = 32..63):
        phys(k)   = 32 (kb // 2) + 8 c + 4 (kb % 2) + 2 h + e
so a thread's words are words 2c and 2c + 1 of its row in each chunk, and word p of the low chunk
holds the nibbles of view word p of both halves (format.py), as the Triton kernel assumes too.

x goes through a double-buffered shared tile [BMN, 64] (wgmma's operand B), one barrier per
record; the records are prefetched DEPTH deep straight into registers. Work is divided stream-K
(w12_wgmma_kernel): a fixed number of resident programs, each with the same count of records.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from .gemm_kernels import ASM_HI, ASM_LO


@gluon.constexpr_function
def words_layout(bn):
    """[BN, 8] int32 words of one 4 KB chunk: thread (row r, lane c) holds words 2c, 2c + 1 of rows
    r and r + 8 (and r + 64 when BN = 128): the rows and columns of its wgmma A fragments."""
    regs = [[0, 1], [8, 0]] + ([[64, 0]] if bn == 128 else [])
    lanes = [[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]]
    return gl.DistributedLinearLayout(regs, lanes, [[16, 0], [32, 0]], [], [bn, 8])


@gluon.jit
def _load_record(p, chunk, live):
    """One record's three chunks as [BN, 8] int32 words (zeros past the split's end)."""
    mask = chunk < live.to(gl.int32) * 1024  # chunk < 1024: all true while live
    vlo = gl.load(p + chunk, mask=mask, other=0)
    vhi = gl.load(p + 1024 + chunk, mask=mask, other=0)
    low = gl.load(p + 2048 + chunk, mask=mask, other=0)
    return vlo, vhi, low


@gluon.jit
def _rebuild(vlo, vhi, low, AL: gl.constexpr):
    """Words -> the bf16 A operand [BN, 64] in logical k order (module docstring)."""
    BN: gl.constexpr = vlo.shape[0]
    p0, p1 = gl.inline_asm_elementwise(
        ASM_LO, "=r,=r,r,r", [vlo, low], dtype=(gl.int32, gl.int32), is_pure=True, pack=1
    )
    q0, q1 = gl.inline_asm_elementwise(
        ASM_HI, "=r,=r,r,r", [vhi, low], dtype=(gl.int32, gl.int32), is_pure=True, pack=1
    )
    t = gl.join(gl.join(p0, p1), gl.join(q0, q1))  # [BN, p, h, kb // 2], p = 2c + kb % 2
    t = gl.reshape(t, [BN, 4, 2, 2, 2])  # (row, c, kb % 2, h, kb // 2)
    t = gl.permute(t, [0, 4, 2, 3, 1])  # (row, kb // 2, kb % 2, h, c)
    t = gl.reshape(t, [BN, 32])  # bf16 pair index 8 kb + 4 h + c
    lo = t.to(gl.int16).to(gl.bfloat16, bitcast=True)
    hi = (t >> 16).to(gl.int16).to(gl.bfloat16, bitcast=True)
    w = gl.reshape(gl.join(lo, hi), [BN, 64])
    return gl.convert_layout(w, AL, assert_trivial=True)


@gluon.jit
def _x_tile(x, xoff, rows_ok, phys, K, kt, live):
    """x[m0 + i, 64 kt + phys(k)] as [BMN, 64] bf16 (zeros for rows >= M, columns >= K, or past
    the split: padded record columns hold zero weights, but x there may not even be readable)."""
    mask = rows_ok[:, None] & (kt * 64 + phys < K)[None, :] & live
    return gl.load(x + xoff + kt * 64, mask=mask, other=0.0)


@gluon.jit
def _escape_term(e, has, col, val, ms, mmask, x, stride_xm):
    xv = gl.load(x + ms[None, :] * stride_xm + col[:, None], mask=has[:, None] & mmask[None, :], other=0.0)
    return gl.where(has[:, None], e + val[:, None] * xv.to(gl.float32), e)


@gluon.jit
def _escape_sum(rows, ms, M, N, x, stride_xm, esc_ptr, esc_col, esc_bits, EL: gl.constexpr):
    """e[n, m] = sum of channel n's escapes w * x[m, col], added from 0.0 in escape-list order."""
    rmask = rows < N
    mmask = ms < M
    start = gl.load(esc_ptr + rows, mask=rmask, other=0)
    count = gl.load(esc_ptr + rows + 1, mask=rmask, other=0) - start
    e = gl.zeros([rows.shape[0], ms.shape[0]], gl.float32, EL)
    for j in range(0, gl.max(count, axis=0)):
        has = j < count
        col = gl.load(esc_col + start + j, mask=has, other=0).to(gl.int32)
        bits = gl.load(esc_bits + start + j, mask=has, other=0)
        e = _escape_term(
            e, has, col, bits.to(gl.bfloat16, bitcast=True).to(gl.float32), ms, mmask, x, stride_xm
        )
    return e


@gluon.jit
def _fence_gpu(t):
    """fence.acq_rel.gpu in every thread (t: any tensor with one element per thread or more)."""
    return gl.inline_asm_elementwise(
        "fence.acq_rel.gpu; mov.b32 $0, $1;", "=r,r", [t], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _mma_step(acc, a, xc, buf):
    """acc += a @ xc^T with xc staged in the shared tile buf (all four warps' stores, then the dot)."""
    buf.store(xc)
    fence_async_shared()
    gl.thread_barrier()
    return warpgroup_mma(a, buf.permute((1, 0)), acc)


@gluon.jit
def _segment(rec, x, rb, k0, k1, KT, K, xs, xoff, xrow, phys, wr, wp, BN: gl.constexpr, BMN: gl.constexpr, DEPTH: gl.constexpr,
             AL: gl.constexpr, MMA: gl.constexpr):  # fmt: skip
    """acc[BN, BMN] = the rebuilt W rows of row block rb times x^T over records k0 <= kt < k1.

    DEPTH record buffers, each refilled right after its rebuild has read it (the loop is unrolled
    DEPTH times), so a loaded register is never copied: copying one whose load is still in flight
    would wait for the load and serialize the loop on memory latency. With DEPTH = 2 an odd
    segment runs one masked record of zeros at its end (its products add exactly 0)."""
    n0 = rb * BN
    chunk = (n0 % 128 + wr)[:, None] * 8 + wp[None, :]
    base = rec + (n0 // 128).to(gl.int64) * KT * 3072
    ra = _load_record(base + k0 * 3072, chunk, k0 < k1)
    xa = _x_tile(x, xoff, xrow, phys, K, k0, k0 < k1)
    if DEPTH == 2:
        rb_ = _load_record(base + (k0 + 1) * 3072, chunk, k0 + 1 < k1)
        xb = _x_tile(x, xoff, xrow, phys, K, k0 + 1, k0 + 1 < k1)
    acc = gl.zeros([BN, BMN], gl.float32, MMA)
    for kt in range(k0, k1, DEPTH):
        a = _rebuild(ra[0], ra[1], ra[2], AL)
        ra = _load_record(base + (kt + DEPTH) * 3072, chunk, kt + DEPTH < k1)
        acc = _mma_step(acc, a, xa, xs.index(0))
        xa = _x_tile(x, xoff, xrow, phys, K, kt + DEPTH, kt + DEPTH < k1)
        if DEPTH == 2:
            b = _rebuild(rb_[0], rb_[1], rb_[2], AL)
            rb_ = _load_record(base + (kt + 3) * 3072, chunk, kt + 3 < k1)
            acc = _mma_step(acc, b, xb, xs.index(1))
            xb = _x_tile(x, xoff, xrow, phys, K, kt + 3, kt + 3 < k1)
    return acc


@gluon.jit
def _finish(y, rb, em, M, N, x, stride_xm, out, stride_om, exps, esc_ptr, esc_col, esc_bits, bias,
            BN: gl.constexpr, HAS_BIAS: gl.constexpr, EL: gl.constexpr):  # fmt: skip
    """out = y * 2^(E_n - 127) + the escapes + bias, rounded once to out's dtype."""
    er = rb * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, EL))
    e = _escape_sum(er, em, M, N, x, stride_xm, esc_ptr, esc_col, esc_bits, EL)
    en = gl.load(exps + er, mask=er < N, other=127).to(gl.int32)
    y = y * (en << 23).to(gl.float32, bitcast=True)[:, None] + e
    if HAS_BIAS:
        y += gl.load(bias + er, mask=er < N, other=0.0).to(gl.float32)[:, None]
    mask = (er < N)[:, None] & (em < M)[None, :]
    gl.store(out + em[None, :] * stride_om + er[:, None], y.to(out.dtype.element_ty), mask=mask)


@gluon.jit(do_not_specialize=["M"])
def w12_wgmma_kernel(
    rec, x, out, part, count, exps, esc_ptr, esc_col, esc_bits, bias,
    M, N, K, KT, RB, stride_xm, stride_om,
    BN: gl.constexpr, BMN: gl.constexpr, HAS_BIAS: gl.constexpr, DEPTH: gl.constexpr,
):  # fmt: skip
    """Stream-K over the records: program p of P (grid (P, M / BMN), one warpgroup each) takes the
    records [p W / P, (p + 1) W / P) of the W = RB * KT records in (row block, kt) order, so every
    program has the same work within one record (no tail of short programs, no K split to tune).

    A row block whose records lie in one program is finished there. Otherwise each contributing
    program stores its fp32 partial (slot 0: its first segment, slot 1: its last), fences, and
    counts itself in count[m block, row block]; the last to arrive adds the partials in program
    order (a fixed order: same bits every run whoever arrives last), finishes the tile and resets
    the counter to 0 for the next call. rec: the records as int32 words."""
    WL: gl.constexpr = words_layout(BN)
    MMA: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BMN, 16]
    )
    AL: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    XL: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [4, 1], [1, 0])
    XS: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    EL: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [4, 1], [0, 1])

    p = gl.program_id(0)
    P = gl.num_programs(0)
    mb = gl.program_id(1)
    m0 = mb * BMN
    W = RB * KT
    start = (p * W) // P
    end = ((p + 1) * W) // P

    wr = gl.arange(0, BN, layout=gl.SliceLayout(1, WL))
    wp = gl.arange(0, 8, layout=gl.SliceLayout(0, WL))
    xm = m0 + gl.arange(0, BMN, layout=gl.SliceLayout(1, XL))
    kl = gl.arange(0, 64, layout=gl.SliceLayout(0, XL))
    kb = kl // 16
    phys = (kb // 2) * 32 + ((kl // 2) % 4) * 8 + (kb % 2) * 4 + ((kl // 8) % 2) * 2 + kl % 2
    xoff = xm[:, None] * stride_xm + phys[None, :]
    xrow = xm < M
    er = gl.arange(0, BN, layout=gl.SliceLayout(1, EL))
    em = m0 + gl.arange(0, BMN, layout=gl.SliceLayout(0, EL))
    tile = (em - m0)[None, :] * BN + er[:, None]  # offsets inside one [BMN, BN] partial
    part = part + mb.to(gl.int64) * P * 2 * BMN * BN
    xs = gl.allocate_shared_memory(gl.bfloat16, [2, BMN, 64], XS)

    w = start
    while w < end:
        rb = w // KT
        k0 = w - rb * KT
        k1 = gl.minimum(end - rb * KT, KT)
        acc = _segment(rec, x, rb, k0, k1, KT, K, xs, xoff, xrow, phys, wr, wp, BN, BMN, DEPTH, AL, MMA)
        y = gl.convert_layout(acc, EL)
        if (k0 == 0) & (k1 == KT):
            _finish(y, rb, em, M, N, x, stride_xm, out, stride_om, exps, esc_ptr, esc_col, esc_bits, bias,
                    BN, HAS_BIAS, EL)  # fmt: skip
        else:
            gl.store(part + (p * 2 + (w != start).to(gl.int32)) * BMN * BN + tile, y)
            _fence_gpu(er)
            gl.thread_barrier()
            first = ((rb * KT + 1) * P - 1) // W  # the programs whose records meet row block rb
            last = (((rb + 1) * KT) * P - 1) // W
            ctr = count + mb * RB + rb
            if gl.atomic_add(ctr, 1, sem="acq_rel", scope="gpu") == last - first:
                _fence_gpu(er)
                y = gl.zeros([BN, BMN], gl.float32, EL)
                for q in range(first, last + 1):
                    slot = q * 2 + ((q * W) // P < rb * KT).to(gl.int32)
                    y += gl.load(part + slot * BMN * BN + tile, cache_modifier=".cg")
                gl.atomic_xchg(ctr, 0, sem="relaxed", scope="gpu")
                _finish(y, rb, em, M, N, x, stride_xm, out, stride_om, exps, esc_ptr, esc_col, esc_bits, bias,
                        BN, HAS_BIAS, EL)  # fmt: skip
        w = (rb + 1) * KT
