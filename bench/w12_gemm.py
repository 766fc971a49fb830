"""W12 GEMM vs cuBLAS (torch.nn.functional.linear) at decode sizes on one GPU.

    PYTHONPATH=. python bench/w12_gemm.py --phase sweep --out DIR   # configs x shapes x M
    PYTHONPATH=. python bench/w12_gemm.py --phase final --out DIR   # the shipped configs

Times are medians of triton.testing.do_bench (L2 flushed before every call) over R rotating
copies of weights and activations (random data, never zeros), measured two ways: plain launches,
and replays of a CUDA graph holding the call (what a decode loop runs). Bandwidth counts the W12
bytes a call must read (records + x). cuBLAS is measured in the same run. Prints a compact table
last and writes every number to DIR/w12_gemm_<phase>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch
import triton

from specpilot.kernels.w12 import GemmConfig, encode, exact_matmul_fp64, w12_matmul
from specpilot.kernels.w12.gemm import block_m, default_config, record_bytes_read

SHAPES = {"qkv": (10240, 5120), "o": (5120, 8192), "gate_up": (34816, 5120), "down": (5120, 17408)}
# Llama-3.1-8B's fused projections (bench/w12_refspec.py --random-layers): --shapes qkv_8b,...
SHAPES_8B = {
    "qkv_8b": (6144, 4096),
    "o_8b": (4096, 4096),
    "gate_up_8b": (28672, 4096),
    "down_8b": (4096, 14336),
}
MS = (1, 8, 16, 32, 48, 64)
L2_BYTES = 60 * 2**20
REP_MS = 60


def weights(n: int, k: int, seed: int) -> torch.Tensor:
    """Trained-like bf16 weights: per-channel scales, a wider component, rare large outliers."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    scale = 0.02 * torch.exp(torch.randn(n, 1, device="cuda", generator=g) * 0.35)
    w = torch.randn(n, k, device="cuda", generator=g) * scale
    w = torch.where(torch.rand(n, k, device="cuda", generator=g) < 0.1, w * 3, w)
    w = torch.where(torch.rand(n, k, device="cuda", generator=g) < 1e-5, w * 100, w)
    return w.to(torch.bfloat16)


def timed(fns, graph: bool) -> float:
    """Median µs of calling fns[i % R] (rotating), plain or as CUDA-graph replays."""
    for f in fns:
        f()
    if graph:
        graphs = []
        for f in fns:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                f()
            graphs.append(g)
        fns = [g.replay for g in graphs]
    i = [0]

    def run():
        fns[i[0] % len(fns)]()
        i[0] += 1

    return 1000 * triton.testing.do_bench(run, warmup=25, rep=REP_MS, return_mode="median")


SEEDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "w12_seeds.json")


def candidates(n: int, k: int, m: int) -> list[GemmConfig]:
    """The sweep: the previous sweep's four best configs for this layer and M (w12_seeds.json;
    that sweep covered both dot orientations, 64/128-row blocks, splits, depths and register caps)
    plus narrow blocks of 16/32 rows with x as operand A, which need fewer (or no) K splits. A
    shape with no seeds gets the same families as a grid: x as operand A, 32/64/128-row blocks,
    splits from one to about ten programs per SM, 3 or 5 stages, 1 or 2 records per step."""
    name = next((nm for nm, shape in SHAPES.items() if shape == (n, k)), None)
    kt = -(-k // 64)
    if name is None:
        out = []
        for bn, warps in ((32, 2), (64, 4), (128, 4)):
            blocks = -(-n // bn)
            for s in (1, 2, 3, 4, 6, 8):
                if blocks * s > 1400 or kt // s < 4 or (s > 1 and blocks * (s - 1) >= 132 * 4):
                    continue
                out += [GemmConfig(bn, s, warps, st, rpi, True) for st in (3, 5) for rpi in (1, 2)]
        return out
    with open(SEEDS) as f:
        seeds = json.load(f).get(f"{name}:{1 if m <= 16 else 32}", [])
    out = [GemmConfig(**c) for c in seeds[:4]]
    for bn, warps in ((32, 2), (32, 4), (16, 2)):
        if m > 16 and bn == 16:
            continue
        blocks = -(-n // bn)
        splits = [s for s in (1, 2) if blocks * s <= 1400 and kt // s >= 8][: 2 if m <= 16 else 1]
        for rpi in (1, 2):
            for stages in (3, 5):
                out += [GemmConfig(bn, s, warps, stages, rpi, True) for s in splits]
    return out


def _compile_chunk(chunk) -> int:
    """Worker: run each (config, M, qpass, use_asm) once on a small matrix (same specialization)."""
    torch.cuda.set_device(0)
    t = encode(weights(1024, 1024, 0))
    done = 0
    for cfg, m, qpass, use_asm in chunk:
        x = torch.randn(m, 1024, device="cuda").to(torch.bfloat16)
        try:
            w12_matmul(x, t, config=GemmConfig(**cfg), qpass=qpass, use_asm=use_asm)
            done += 1
        except Exception as e:  # reported; the sweep skips configs that fail
            print(f"precompile {cfg} M={m}: {e!r}"[:400], flush=True)
    torch.cuda.synchronize()
    return done


def precompile(jobs: int) -> None:
    """Fill Triton's on-disk cache with every kernel the sweep can launch, in `jobs` processes."""
    import multiprocessing as mp

    cfgs = {c for n, k in (SHAPES | SHAPES_8B).values() for m in (1, 32) for c in candidates(n, k, m)}
    groups: dict[tuple, list] = {}  # one group per main-kernel compile key: one worker compiles it
    for c in sorted(cfgs, key=str):
        for m in (1, 32, 64):
            for q, a in ((False, True),):  # Q pass and plain rebuild: only the winners, compiled lazily
                key = (c.block_n, c.num_warps, c.num_stages, c.rpi, c.xa, c.maxnreg, c.split > 1, m, q, a)
                groups.setdefault(key, []).append((c.__dict__, m, q, a))
    chunks = [[] for _ in range(jobs)]
    for i, g in enumerate(groups.values()):
        chunks[i % jobs] += g
    t0 = time.time()
    with mp.get_context("spawn").Pool(jobs) as pool:
        done = sum(pool.map(_compile_chunk, chunks))
    print(f"precompiled {done} launches in {time.time() - t0:.0f} s")


class Case:
    def __init__(self, name: str, n: int, k: int, rot: int):
        self.name, self.n, self.k = name, n, k
        self.ws = [weights(n, k, seed=s) for s in range(rot)]
        self.ts = [encode(w) for w in self.ws]
        self.stats = self.ts[0].stats()

    def xs(self, m: int) -> list[torch.Tensor]:
        return [torch.randn(m, self.k, device="cuda").to(torch.bfloat16) for _ in self.ws]


def check(case: Case, m: int, cfg: GemmConfig, x: torch.Tensor) -> dict:
    """fp64 error, plain-rebuild equality and run-to-run equality for one config."""
    t, w = case.ts[0], case.ws[0]
    ref = exact_matmul_fp64(x, w)
    y = w12_matmul(x, t, config=cfg)
    y32 = w12_matmul(x, t, config=cfg, out_dtype=torch.float32)
    plain = w12_matmul(x, t, config=cfg, use_asm=False)
    again = w12_matmul(x, t, config=cfg)
    return {
        "rel_err_bf16": float((y.double() - ref).norm() / ref.norm()),
        "rel_err_fp32": float((y32.double() - ref).norm() / ref.norm()),
        "asm_equals_plain": bool(torch.equal(y.view(torch.int16), plain.view(torch.int16))),
        "same_bits_again": bool(torch.equal(y.view(torch.int16), again.view(torch.int16))),
    }


def row_graph_us(results) -> float:
    return results[0][0]


def bench_case(case: Case, ms, phase: str, log) -> list[dict]:
    rows = []
    best_by_bm: dict[int, list[tuple[float, GemmConfig]]] = {}
    for m in ms:
        xs = case.xs(m)
        ex = [(lambda x=x, w=w: torch.nn.functional.linear(x, w)) for x, w in zip(xs, case.ws, strict=True)]
        row = {"layer": case.name, "N": case.n, "K": case.k, "M": m}
        row["cublas_us"] = timed(ex, graph=False)
        row["cublas_graph_us"] = timed(ex, graph=True)
        if phase == "sweep":
            pool = best_by_bm.get(min(block_m(m), 32))  # M <= 16 reuse M=1's ranking, M > 16 M=32's
            cfgs = candidates(case.n, case.k, m) if pool is None else [c for _, c in pool[:4]]
        else:
            cfgs = [default_config(case.n, case.k, m)]
        results = []
        for cfg in cfgs:
            fns = [
                (lambda x=x, t=t, c=cfg: w12_matmul(x, t, config=c)) for x, t in zip(xs, case.ts, strict=True)
            ]
            try:
                us = timed(fns, graph=True)  # kernel time: the plain launch path is CPU-bound
            except Exception as e:  # a config that fails to launch is reported, not fatal
                log(f"  {case.name} M={m} {cfg} FAILED {e!r}")
                continue
            results.append((us, cfg))
            log(f"  {case.name} M={m} {cfg}: graph {us:.2f} us (cuBLAS {row['cublas_graph_us']:.2f})")
        results.sort(key=lambda r: r[0])
        if phase == "sweep" and min(block_m(m), 32) not in best_by_bm:
            best_by_bm[min(block_m(m), 32)] = results
        cfg = results[0][1]
        fns = [(lambda x=x, t=t, c=cfg: w12_matmul(x, t, config=c)) for x, t in zip(xs, case.ts, strict=True)]
        qfns = [
            (lambda x=x, t=t, c=cfg: w12_matmul(x, t, config=c, qpass=True))
            for x, t in zip(xs, case.ts, strict=True)
        ]
        nbytes = record_bytes_read(case.ts[0]) + xs[0].numel() * 2
        us = timed(fns, graph=False)
        row.update(
            w12_us=us,
            w12_graph_us=timed(fns, graph=True),
            qpass_us=timed(qfns, graph=False),
            qpass_graph_us=timed(qfns, graph=True),
            config=cfg.__dict__,
            w12_TBps=nbytes / row_graph_us(results) / 1e6,
            ratio=row["cublas_us"] / us,
            all_configs=[(u, c.__dict__) for u, c in results],
        )
        row["ratio_graph"] = row["cublas_graph_us"] / row["w12_graph_us"]
        row["check"] = check(case, m, cfg, xs[0])
        rows.append(row)
    return rows


def copy_bandwidth() -> float:
    """The ceiling: a 1 GiB device-to-device copy, bytes read + written, TB/s."""
    big = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    us = 1000 * triton.testing.do_bench(lambda: big.clone(), warmup=25, rep=100, return_mode="median")
    return 2 * big.numel() / us / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=("sweep", "final"), default="final")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--precompile", type=int, default=0, help="only fill the compile cache, in N processes")
    args = ap.parse_args()
    if args.precompile:
        return precompile(args.precompile)
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, f"w12_gemm_{args.phase}.log"), "w")  # noqa: SIM115 (whole run)

    def log(s: str) -> None:
        print(s, file=logf, flush=True)

    props = torch.cuda.get_device_properties(0)
    meta = {
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "copy_TBps": copy_bandwidth(),
        "phase": args.phase,
    }
    log(json.dumps(meta))
    rows = []
    t0 = time.time()
    for name in args.shapes.split(","):
        n, k = (SHAPES | SHAPES_8B)[name]
        rot = max(2, math.ceil(3 * L2_BYTES / (n * k * 3.5)))  # bf16 + W12 copies > 3x L2
        case = Case(name, n, k, rot)
        log(f"{name} {n}x{k}: rotating {rot} copies, {case.stats}")
        rows += bench_case(case, [int(m) for m in args.ms.split(",")], args.phase, log)
        del case
        torch.cuda.empty_cache()
        with open(os.path.join(args.out, f"w12_gemm_{args.phase}.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    log(f"total {time.time() - t0:.0f} s")
    print(json.dumps(meta))
    print(
        f"{'layer':8s} {'M':>3s} {'cuBLAS':>7s} {'W12':>7s} {'ratio':>6s} {'TB/s':>5s} {'g:cuB':>7s} {'g:W12':>7s} {'g:rat':>6s} {'Q':>6s}  config / check"
    )
    for r in rows:
        c, ck = r["config"], r["check"]
        ok = "ok" if ck["asm_equals_plain"] and ck["same_bits_again"] and ck["rel_err_bf16"] < 1e-2 else "BAD"
        print(
            f"{r['layer']:8s} {r['M']:3d} {r['cublas_us']:7.2f} {r['w12_us']:7.2f} {r['ratio']:6.3f} "
            f"{r['w12_TBps']:5.2f} {r['cublas_graph_us']:7.2f} {r['w12_graph_us']:7.2f} {r['ratio_graph']:6.3f} "
            f"{r['qpass_graph_us']:6.2f}  {c['block_n']}/{c['split']}/{c['num_warps']}/{c['num_stages']}/{c['rpi']}"
            f"/{'xa' if c['xa'] else 'sw'}/{c['maxnreg']} "
            f"{ok} {ck['rel_err_bf16']:.1e}"
        )


if __name__ == "__main__":
    sys.exit(main())
