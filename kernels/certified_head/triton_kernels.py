"""Triton kernels of the certified head (imported only when the Triton path runs).

Pipeline for M hidden rows (launched by `gpu.py`):
  split  (grid M)            h -> int8 limbs p1, p2, scales t1, t2, ||h||, ||r|| ; zeroes the counter
  bounds (grid V / BN)       int8 x int8 -> int32 dots over the int8 head; writes upper [M, V] and
                             the max lower bound of each block [M, NB]
  select (grid V/CHUNK x M)  L_m = max lower; appends every v with upper >= L_m to a survivor list
  rescore(grid P x M)        float64 dot of each survivor's original row with h, and its bound
  final  (grid M)            float64 leader (smallest index on ties); flags a row whose leader is
                             not separated from every other survivor (host resolves it exactly),
                             whose list overflowed, or whose hidden state is not finite

Bound in `bounds` (u = 2^-24). With A1 = q.p1, A2 = q.p2 exact int32:
  z_v = s_v (t1 A1 + t2 A2) + s_v q_v.r + e_v.h
  a   = fl(s * fl(fl(t1 fl(A1)) + fl(t2 fl(A2))))      |a - s(t1 A1 + t2 A2)| <= gamma_4 s(|t1 A1| + |t2 A2|)
                                                       <= 5u s (|y1| + |y2|)  (y = the computed products)
  |s_v q_v.r| <= deq_norm_v ||r||,   |e_v.h| <= err_norm_v ||h||      (Cauchy-Schwarz)
  Delta = (err_norm ||h|| + deq_norm ||r|| + 5u s(|y1|+|y2|) + 4u |a|) (1 + 2^-18) + 1e-30
The factor (1 + 2^-18) covers the float32 evaluation of Delta (< 10 roundings of non-negative
terms, FMA contraction or not); 4u|a| covers the rounding of a -+ Delta; 1e-30 covers underflow
(flush-to-zero included). NaN bounds (only after an fp32 overflow) become -inf / +inf.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def split_kernel(
    X, stride_xm, P1, P2, stride_pm, T, NRM, CNT, H, BLOCK: tl.constexpr, N_CHUNKS: tl.constexpr
):
    m = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    xrow = X + m.to(tl.int64) * stride_xm
    amax = tl.zeros([BLOCK], tl.float64)
    for c in range(N_CHUNKS):
        o = c * BLOCK + offs
        x = tl.load(xrow + o, mask=o < H, other=0.0).to(tl.float64)
        amax = tl.maximum(amax, tl.abs(x))
    a1 = tl.max(amax, 0)
    t1 = tl.where(a1 > 0, a1 / 127.0, 1.0).to(tl.float32).to(tl.float64)
    amax2 = tl.zeros([BLOCK], tl.float64)
    for c in range(N_CHUNKS):
        o = c * BLOCK + offs
        x = tl.load(xrow + o, mask=o < H, other=0.0).to(tl.float64)
        p1 = tl.minimum(tl.maximum(tl.floor(x / t1 + 0.5), -127.0), 127.0)
        amax2 = tl.maximum(amax2, tl.abs(x - t1 * p1))
    a2 = tl.max(amax2, 0)
    t2 = tl.where(a2 > 0, a2 / 127.0, 1.0).to(tl.float32).to(tl.float64)
    hsq = tl.zeros([BLOCK], tl.float64)
    rsq = tl.zeros([BLOCK], tl.float64)
    for c in range(N_CHUNKS):
        o = c * BLOCK + offs
        msk = o < H
        x = tl.load(xrow + o, mask=msk, other=0.0).to(tl.float64)
        p1 = tl.minimum(tl.maximum(tl.floor(x / t1 + 0.5), -127.0), 127.0)
        r1 = x - t1 * p1
        p2 = tl.minimum(tl.maximum(tl.floor(r1 / t2 + 0.5), -127.0), 127.0)
        r = r1 - t2 * p2
        hsq += x * x
        rsq += r * r
        tl.store(P1 + m * stride_pm + o, p1.to(tl.int8), mask=msk)
        tl.store(P2 + m * stride_pm + o, p2.to(tl.int8), mask=msk)
    # Norms: float64 sums (relative error < 2^-37 here) widened by 2^-20 before the float32
    # conversion (round to nearest, relative 2^-24), so the stored values are upper bounds.
    slack = 1.00000095367431640625  # 1 + 2^-20
    tl.store(T + 2 * m, t1.to(tl.float32))
    tl.store(T + 2 * m + 1, t2.to(tl.float32))
    tl.store(NRM + 2 * m, (tl.sqrt(tl.sum(hsq, 0)) * slack).to(tl.float32))
    tl.store(NRM + 2 * m + 1, (tl.sqrt(tl.sum(rsq, 0)) * slack).to(tl.float32))
    tl.store(CNT + m, 0)


@triton.jit
def bounds_kernel(
    Q, S, EN, DN, P1, P2, T, NRM, UP, LO, BMAX,
    M, V, H, NB, stride_qv, stride_pm, stride_um,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, WRITE_LO: tl.constexpr, DOT_ACC: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    offs_n = pid * BN + tl.arange(0, BN)
    offs_m = tl.arange(0, BM)
    offs_k = tl.arange(0, BK)
    nmask = offs_n < V
    q_ptrs = Q + offs_n.to(tl.int64)[:, None] * stride_qv + offs_k[None, :]
    p1_ptrs = P1 + offs_m[:, None] * stride_pm + offs_k[None, :]
    p2_ptrs = P2 + offs_m[:, None] * stride_pm + offs_k[None, :]
    acc1 = tl.zeros((BM, BN), dtype=tl.int32)
    acc2 = tl.zeros((BM, BN), dtype=tl.int32)
    for k in range(0, H, BK):
        if EVEN_K:
            if EVEN_N:  # noqa: SIM108  (a constexpr branch, not a runtime one)
                q = tl.load(q_ptrs)
            else:
                q = tl.load(q_ptrs, mask=nmask[:, None], other=0)
            p1 = tl.load(p1_ptrs)
            p2 = tl.load(p2_ptrs)
        else:
            kmask = (k + offs_k) < H
            q = tl.load(q_ptrs, mask=nmask[:, None] & kmask[None, :], other=0)
            p1 = tl.load(p1_ptrs, mask=kmask[None, :], other=0)
            p2 = tl.load(p2_ptrs, mask=kmask[None, :], other=0)
        qt = tl.trans(q)
        if DOT_ACC:
            acc1 = tl.dot(p1, qt, acc1, out_dtype=tl.int32)
            acc2 = tl.dot(p2, qt, acc2, out_dtype=tl.int32)
        else:
            acc1 += tl.dot(p1, qt, out_dtype=tl.int32)
            acc2 += tl.dot(p2, qt, out_dtype=tl.int32)
        q_ptrs += BK
        p1_ptrs += BK
        p2_ptrs += BK
    mmask = offs_m < M
    s = tl.load(S + offs_n, mask=nmask, other=0.0)
    en = tl.load(EN + offs_n, mask=nmask, other=0.0)
    dn = tl.load(DN + offs_n, mask=nmask, other=0.0)
    t1 = tl.load(T + 2 * offs_m, mask=mmask, other=0.0)
    t2 = tl.load(T + 2 * offs_m + 1, mask=mmask, other=0.0)
    hn = tl.load(NRM + 2 * offs_m, mask=mmask, other=0.0)
    rn = tl.load(NRM + 2 * offs_m + 1, mask=mmask, other=0.0)
    y1 = acc1.to(tl.float32) * t1[:, None]
    y2 = acc2.to(tl.float32) * t2[:, None]
    a = (y1 + y2) * s[None, :]
    fp = (tl.abs(y1) + tl.abs(y2)) * s[None, :]
    delta = (
        en[None, :] * hn[:, None]
        + dn[None, :] * rn[:, None]
        + fp * 2.9802322387695312e-07
        + tl.abs(a) * 2.384185791015625e-07
    )
    delta = delta * 1.000003814697265625 + 1e-30  # (1 + 2^-18)
    up = a + delta
    lo = a - delta
    up = tl.where(up == up, up, float("inf"))
    valid = mmask[:, None] & nmask[None, :]
    lo = tl.where((lo == lo) & valid, lo, float("-inf"))
    u_ptrs = offs_m[:, None] * stride_um + offs_n.to(tl.int64)[None, :]
    tl.store(UP + u_ptrs, up, mask=valid)
    if WRITE_LO:
        tl.store(LO + u_ptrs, lo, mask=valid)
    tl.store(BMAX + offs_m * NB + pid, tl.max(lo, 1), mask=mmask)


@triton.jit
def select_kernel(UP, BMAX, CNT, IDX, V, NB, stride_um, CAP, CHUNK: tl.constexpr, NB_P2: tl.constexpr):
    c = tl.program_id(0)
    m = tl.program_id(1)
    ob = tl.arange(0, NB_P2)
    bm = tl.load(BMAX + m * NB + ob, mask=ob < NB, other=float("-inf"))
    level = tl.max(bm, 0)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    msk = offs < V
    up = tl.load(UP + m.to(tl.int64) * stride_um + offs, mask=msk, other=float("-inf"))
    keep = ((up >= level) & msk).to(tl.int32)
    n = tl.sum(keep, 0)
    if n > 0:
        base = tl.atomic_add(CNT + m, n)
        pos = base + tl.cumsum(keep, 0) - 1
        tl.store(IDX + m * CAP + pos, offs, mask=(keep > 0) & (pos < CAP))


@triton.jit
def rescore_kernel(
    W, X, IDX, CNT, Z, ERR, H, stride_wv, stride_xm, CAP, err_factor,
    BS: tl.constexpr, BKR: tl.constexpr,
):  # fmt: skip
    m = tl.program_id(1)
    cnt = tl.minimum(tl.load(CNT + m), CAP)
    # A fixed grid strides over however many survivors the row has (unknown when launched).
    for j0 in range(tl.program_id(0) * BS, cnt, tl.num_programs(0) * BS):
        offs_j = j0 + tl.arange(0, BS)
        jm = offs_j < cnt
        rows = tl.load(IDX + m * CAP + offs_j, mask=jm, other=0).to(tl.int64)
        acc = tl.zeros([BS], tl.float64)
        aacc = tl.zeros([BS], tl.float64)
        for k in range(0, H, BKR):
            ok = k + tl.arange(0, BKR)
            km = ok < H
            w = tl.load(
                W + rows[:, None] * stride_wv + ok[None, :], mask=jm[:, None] & km[None, :], other=0.0
            )
            x = tl.load(X + m.to(tl.int64) * stride_xm + ok, mask=km, other=0.0)
            p = w.to(tl.float64) * x.to(tl.float64)[None, :]
            acc += tl.sum(p, 1)
            aacc += tl.sum(tl.abs(p), 1)
        tl.store(Z + m * CAP + offs_j, acc, mask=jm)
        tl.store(ERR + m * CAP + offs_j, aacc * err_factor, mask=jm)


@triton.jit
def final_kernel(Z, ERR, IDX, CNT, NRM, OUT, M, CAP, CAP_P2: tl.constexpr):
    """OUT[0, m] = the leader of row m, OUT[1, m] = its flag."""
    m = tl.program_id(0)
    raw = tl.load(CNT + m)
    cnt = tl.minimum(raw, CAP)
    offs = tl.arange(0, CAP_P2)
    vm = offs < cnt
    z = tl.load(Z + m * CAP + offs, mask=vm, other=float("-inf"))
    e = tl.load(ERR + m * CAP + offs, mask=vm, other=0.0)
    idx = tl.load(IDX + m * CAP + offs, mask=vm, other=2147483647)
    top = tl.max(z, 0)
    best = tl.min(tl.where(vm & (z == top), idx, 2147483647), 0)
    is_best = vm & (idx == best)
    eb = tl.max(tl.where(is_best, e, 0.0), 0)
    close = vm & (idx != best) & ((top - z) <= (eb + e))
    unsure = tl.sum(close.to(tl.int32), 0) > 0
    hn = tl.load(NRM + 2 * m)
    flag = tl.where((raw > CAP) | (raw == 0), 1, tl.where(unsure, 2, 0))
    flag = tl.where(hn < float("inf"), flag, 3)
    tl.store(OUT + m, best.to(tl.int64))
    tl.store(OUT + M + m, flag.to(tl.int64))
