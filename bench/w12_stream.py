"""The read-bandwidth floor under a W12 GEMM call, and how the L2 flush moves it (by hand, GPU):

    PYTHONPATH=. python bench/w12_stream.py --out DIR

For each projection shape it times, as CUDA-graph replays: a plain Triton kernel that only reads
the layer's W12 record bytes (grid-stride XOR of 16-byte vectors, best of a small sweep), cuBLAS
(torch.nn.functional.linear on the bf16 weight) and the shipped W12 GEMM at M = 1 and 32. Two
ways: triton.testing.do_bench (median; before every call it zeroes a 256 MB buffer, which leaves
L2 full of dirty lines that the timed call must write back), and a read flush (before every call
a sum over 512 MB: L2 left full of clean lines, closer to a decode step, whose other kernels
mostly read). Writes DIR/w12_stream.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl
from w12_gemm import SHAPES, timed, weights

from specpilot.kernels.w12 import encode, w12_matmul
from specpilot.kernels.w12.gemm import record_bytes_read


@triton.jit
def stream_xor(p, out, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for off in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        acc ^= tl.load(p + off + tl.arange(0, BLOCK))
    tl.store(out + pid * BLOCK + tl.arange(0, BLOCK), acc)


def replay_us(fns, flush: torch.Tensor | None = None, reps: int = 200) -> float:
    """Median µs of CUDA-graph replays of fns[i % R], each timed by a CUDA-event pair; with
    `flush` (> L2), a read of it before every replay."""
    graphs = []
    for f in fns:
        f()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            f()
        graphs.append(g)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush.sum()
        starts[i].record()
        graphs[i % len(graphs)].replay()
        ends[i].record()
    torch.cuda.synchronize()
    return 1000 * sorted(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))[reps // 2]


def both(fns, flush) -> dict:
    return {"dobench_us": timed(fns, graph=True), "readflush_us": replay_us(fns, flush)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flush = torch.randn(2**27, device="cuda")  # 512 MB of fp32
    rows = []
    for name, (n, k) in SHAPES.items():
        ws = [weights(n, k, s) for s in range(2)]
        ts = [encode(w) for w in ws]
        recs = [t.records.view(torch.int32).reshape(-1) for t in ts]
        row = {"layer": name, "w12_bytes": record_bytes_read(ts[0]), "bf16_bytes": n * k * 2}
        best = None
        for block in (2048, 4096):
            for warps in (4, 8):
                for per_sm in (4, 8):
                    g = sms * per_sm
                    out = torch.empty(g * block, dtype=torch.int32, device="cuda")
                    fns = [
                        lambda r=r, o=out, b=block, w=warps, g=g: stream_xor[(g,)](
                            r, o, r.numel(), BLOCK=b, num_warps=w
                        )
                        for r in recs
                    ]
                    us = timed(fns, graph=True)
                    if best is None or us < best[0]:
                        best = (us, fns, (block, warps, per_sm))
        row["read_w12_bytes"] = both(best[1], flush) | {"config": best[2]}
        for m in (1, 32):
            xs = [torch.randn(m, k, device="cuda").to(torch.bfloat16) for _ in ws]
            cub = [lambda x=x, w=w: torch.nn.functional.linear(x, w) for x, w in zip(xs, ws, strict=True)]
            w12 = [lambda x=x, t=t: w12_matmul(x, t) for x, t in zip(xs, ts, strict=True)]
            row[f"cublas_m{m}"] = both(cub, flush)
            row[f"w12_m{m}"] = both(w12, flush)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del ws, ts, recs
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "w12_stream.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
    for mode in ("dobench_us", "readflush_us"):
        print(mode)
        for r in rows:
            read = r["read_w12_bytes"][mode]
            cells = [f"{r['layer']:8s} read-only {read:6.1f}"]
            for m in (1, 32):
                c, w = r[f"cublas_m{m}"][mode], r[f"w12_m{m}"][mode]
                cells.append(f"M={m}: cuBLAS {c:6.1f} W12 {w:6.1f} ({c / w:.3f}; bound {c / read:.3f})")
            print("  ".join(cells))


if __name__ == "__main__":
    main()
