"""Where a W12 tile's time goes (issue 41): one GEMV-shaped kernel over a [N, K] matrix (16 rows of
activations, like refspec's per-phase kernels), step by step from bf16 to the full W12 tile.

    python3 bench/w12_tile_ladder.py [--n 34816 --k 5120] --json OUT   # on the device

Each variant: grid N / BN programs, each looping over K in BK steps (BN 32, BK 128, 4 warps, 3
stages: stock's READ_BOUND tiles), timed with triton.testing.do_bench_cudagraph (median ms).
- bf16:        stock: load the bf16 tile, dot (reads 16 bits a weight)
- bf16_s1:     bf16 without software pipelining (one stage: loads straight to registers)
- bf16_cat:    the same tile loaded as [BN, 32] halves and concatenated (the W12 tile's shape path)
- words:       load each record's three 4 KB chunks as int32 words, xor them into the output: the
               access pattern's read speed, no rebuild, no dot
- ptx_halves:  + the PTX rebuild; two K=32 dots a record, no concatenation, escapes dropped
- ptx_cat:     + the PTX rebuild, halves and records concatenated to [BN, BK], one dot, escapes dropped
- tile_esc:    tile_kernels.w12_gemv (w12_tile, PTX, one dot a K step, then w12_escapes): the
               refspec-w12 entry's kernels' GEMV (bytes: TileWeight.nbytes()); the 2026-12-06 run
               timed the same tile and escape steps with unmasked, cached activation loads
- tile_esc_triton: the same with the plain-Triton rebuild
- gemm:        kernels/w12's W12 GEMM (w12_matmul, its fixed config for 16 rows; escape lists)
- cublas:      torch's a @ wᵀ in bf16 (its time includes copying the bf16 output into the fp32 buffer;
               its outputs are bf16-rounded, so they differ from the fp32 sums nearly everywhere)
`outputs_unlike_bf16` counts the fp32 outputs whose bits differ from the bf16 kernel's.
GB/s counts the bytes each variant's matrix occupies (bf16: 2 N K; W12: TileWeight.nbytes()).
Each Triton variant also reports its tensor-core instructions (wgmma / mma.sync in the PTX),
registers and spills: where two variants' outputs differ in bits, this says whether the dot was
lowered differently.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from specpilot.kernels.w12 import encode, w12_matmul  # noqa: E402
from specpilot.kernels.w12.tile_kernels import (  # noqa: E402
    ASM_HI,
    ASM_LO,
    _cat,
    _pairs_to_bf16,
    w12_base,
    w12_gemv,
)
from specpilot.kernels.w12.tiles import tile_weight  # noqa: E402

PEAK = {"H200": 4.8e12, "H100": 3.35e12}


@triton.jit
def k_bf16(a_ptr, w_ptr, out_ptr, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    nb = tl.program_id(0)
    cols = nb * BN + tl.arange(0, BN)
    rows = tl.arange(0, BM)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :])
        w = tl.load(w_ptr + cols[:, None] * K + ks[None, :])
        acc = tl.dot(a, tl.trans(w), acc)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc)


@triton.jit
def k_bf16_cat(
    a_ptr, w_ptr, out_ptr, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    """bf16, its tile loaded as [BN, 32] halves and concatenated as the W12 tile is: same values,
    a register-built operand (does the dot keep the bf16 kernel's bits?)."""
    nb = tl.program_id(0)
    cols = nb * BN + tl.arange(0, BN)
    rows = tl.arange(0, BM)
    c = tl.arange(0, 32)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :])
        p = w_ptr + cols[:, None] * K + k0 + c[None, :]
        w = _cat(tl.load(p), tl.load(p + 32))
        if BK == 128:
            w = _cat(w, _cat(tl.load(p + 64), tl.load(p + 96)))
        acc = tl.dot(a, tl.trans(w), acc)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc)


@triton.jit
def k_words(rec_ptr, out_ptr, N, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    nb = tl.program_id(0)
    n0 = nb * BN
    KT: tl.constexpr = K // 64
    r = n0 % 128 + tl.arange(0, BN)
    words = tl.arange(0, 8)
    acc = tl.zeros([BN, 8], tl.int32)
    for k0 in range(0, K, BK):
        for i in tl.static_range(BK // 64):
            rec = (n0 // 128) * KT + k0 // 64 + i
            p = (
                rec_ptr.to(tl.pointer_type(tl.int32))
                + rec.to(tl.int64) * 3072
                + r[:, None] * 8
                + words[None, :]
            )
            acc ^= tl.load(p) ^ tl.load(p + 1024) ^ tl.load(p + 2048)
    tl.store(out_ptr + (n0 + tl.arange(0, BN))[:, None] * 8 + words[None, :], acc)


@triton.jit
def _halves(rec_ptr, base, r, rec):
    words = tl.arange(0, 8)
    p = rec_ptr.to(tl.pointer_type(tl.int32)) + rec.to(tl.int64) * 3072 + r[:, None] * 8 + words[None, :]
    v0, v1, lo = tl.load(p), tl.load(p + 1024), tl.load(p + 2048)
    b2 = tl.broadcast_to((base | (base << 16))[:, None], v0.shape)
    a0, a1 = tl.inline_asm_elementwise(ASM_LO, "=r,=r,r,r,r", [v0, lo, b2], dtype=(tl.int32, tl.int32),
                                       is_pure=True, pack=1)  # fmt: skip
    w0 = _pairs_to_bf16(a0, a1)
    a0, a1 = tl.inline_asm_elementwise(ASM_HI, "=r,=r,r,r,r", [v1, lo, b2], dtype=(tl.int32, tl.int32),
                                       is_pure=True, pack=1)  # fmt: skip
    return w0, _pairs_to_bf16(a0, a1)


@triton.jit
def k_ptx(a_ptr, rec_ptr, exp_ptr, out_ptr, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr, CAT: tl.constexpr):  # fmt: skip
    """The PTX rebuild, escaped slots left zero and escapes dropped: one dot a K step (CAT) or two
    K=32 dots a record."""
    nb = tl.program_id(0)
    n0 = nb * BN
    KT: tl.constexpr = K // 64
    r = n0 % 128 + tl.arange(0, BN)
    rows = tl.arange(0, BM)
    base = w12_base(exp_ptr, n0, N, BN)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        rec = (n0 // 128) * KT + k0 // 64
        if CAT:
            w0, w1 = _halves(rec_ptr, base, r, rec)
            w = _cat(w0, w1)
            if BK == 128:
                w2, w3 = _halves(rec_ptr, base, r, rec + 1)
                w = _cat(w, _cat(w2, w3))
            ks = k0 + tl.arange(0, BK)
            a = tl.load(a_ptr + rows[:, None] * K + ks[None, :])
            acc = tl.dot(a, tl.trans(w), acc)
        else:
            for i in tl.static_range(BK // 64):
                w0, w1 = _halves(rec_ptr, base, r, rec + i)
                ks = k0 + i * 64 + tl.arange(0, 32)
                a0 = tl.load(a_ptr + rows[:, None] * K + ks[None, :])
                a1 = tl.load(a_ptr + rows[:, None] * K + 32 + ks[None, :])
                acc = tl.dot(a0, tl.trans(w0), acc)
                acc = tl.dot(a1, tl.trans(w1), acc)
    tl.store(out_ptr + rows[:, None] * N + (n0 + tl.arange(0, BN))[None, :], acc)


@triton.jit
def k_tile_esc(a_ptr, rec_ptr, exp_ptr, esc_ptr, esc_row, esc_col, esc_bits, out_ptr, N, K: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    n0 = tl.program_id(0) * BN
    rows = tl.arange(0, BM)
    acc = w12_gemv(a_ptr, rec_ptr, exp_ptr, esc_ptr, esc_row, esc_col, esc_bits, n0, N, rows, rows >= 0, K, BM, BN,
                   BK, ASM)  # fmt: skip
    tl.store(out_ptr + rows[:, None] * N + (n0 + tl.arange(0, BN))[None, :], acc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=34816)
    ap.add_argument("--k", type=int, default=5120)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    n, k, bm, bn, bk = args.n, args.k, 16, 32, 128
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    scale = 0.02 * torch.exp2(torch.rand(n, 1, device=dev, generator=g) * 2 - 1)
    w = (torch.randn(n, k, device=dev, generator=g) * scale).bfloat16()
    a = torch.randn(bm, k, device=dev, generator=g).bfloat16()
    tw = tile_weight(w)
    t12 = encode(w)  # the W12 GEMM's tensor (no raw rows here: tile_weight returned a copy)
    out = torch.zeros(bm, n, device=dev)
    words = torch.zeros(n, 8, device=dev, dtype=torch.int32)
    launch = dict(num_warps=4, num_stages=3)
    grid = (n // bn,)
    runs = {
        "bf16": (2 * n * k, lambda: k_bf16[grid](a, w, out, n, K=k, BM=bm, BN=bn, BK=bk, **launch)),
        "bf16_s1": (2 * n * k, lambda: k_bf16[grid](a, w, out, n, K=k, BM=bm, BN=bn, BK=bk, num_warps=4, num_stages=1)),
        "bf16_cat": (2 * n * k, lambda: k_bf16_cat[grid](a, w, out, n, K=k, BM=bm, BN=bn, BK=bk, **launch)),
        "words": (tw.records.numel(), lambda: k_words[grid](tw.records, words, n, K=k, BN=bn, BK=bk, **launch)),
        "ptx_halves": (tw.records.numel() + tw.exps.numel(), lambda: k_ptx[grid](a, tw.records, tw.exps, out, n, K=k, BM=bm, BN=bn, BK=bk, CAT=False, **launch)),
        "ptx_cat": (tw.records.numel() + tw.exps.numel(), lambda: k_ptx[grid](a, tw.records, tw.exps, out, n, K=k, BM=bm, BN=bn, BK=bk, CAT=True, **launch)),
        "tile_esc": (tw.nbytes(), lambda: k_tile_esc[grid](a, *tw.parts(), out, n, K=k, BM=bm, BN=bn, BK=bk, ASM=True, **launch)),
        "tile_esc_triton": (tw.nbytes(), lambda: k_tile_esc[grid](a, *tw.parts(), out, n, K=k, BM=bm, BN=bn, BK=bk, ASM=False, **launch)),
        "gemm": (t12.nbytes(), lambda: out.copy_(w12_matmul(a, t12, out_dtype=torch.float32))),
        "cublas": (2 * n * k, lambda: out.copy_(a @ w.t())),
    }  # fmt: skip
    name = torch.cuda.get_device_name(0)
    peak = next((v for key, v in PEAK.items() if key in name), None)
    res = {"device": name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "n": n, "k": k,
           "tile": {"BM": bm, "BN": bn, "BK": bk, **launch}, "w12_bits_per_weight": 8 * tw.nbytes() / (n * k),
           "escapes": tw.escapes, "variants": {}}  # fmt: skip
    ref = None
    for key, (nbytes, fn) in runs.items():
        try:
            kern = fn()
            torch.cuda.synchronize()
            lowered = {}
            if hasattr(kern, "asm"):
                ptx = kern.asm["ptx"]
                lowered = {"wgmma": ptx.count("wgmma.mma_async"), "mma_sync": ptx.count("mma.sync"),
                           "regs": getattr(kern, "n_regs", None), "spills": getattr(kern, "n_spills", None)}  # fmt: skip
            if key == "bf16":
                ref = out.clone()
            diff = None if key == "words" else int((out != ref).sum())
            ms = triton.testing.do_bench_cudagraph(fn, rep=200)
            res["variants"][key] = {"ms": ms, "gb_s": nbytes / ms / 1e6, "of_peak": nbytes / ms / 1e-3 / peak if peak else None,
                                    "outputs_unlike_bf16": diff, "lowered": lowered,
                                    "max_rel_diff": None if not diff else float(((out - ref).abs() / ref.abs().clamp_min(1e-30)).max())}  # fmt: skip
        except Exception as e:
            res["variants"][key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(key, json.dumps(res["variants"][key]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
