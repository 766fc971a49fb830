"""The read-bandwidth ceiling a W12 GEMM call works under (run by hand on a GPU):

    PYTHONPATH=. python bench/w12_stream.py --out DIR

For the gate_up (34816 x 5120) and qkv (10240 x 5120) W12 record bytes it times, as CUDA-graph
replays (triton.testing.do_bench, median): torch's sum over the same bytes, a plain Triton
streaming kernel (grid-stride XOR of 16-byte vectors, swept over block size, warps and programs),
and the register-A kernel's own record loads with no rebuild and no dot (stream-K, same
layouts). The gap between the first two and the W12 GEMM is what the GEMM loses to its access
pattern or its compute.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from w12_gemm import timed

from specpilot.kernels.w12.gemm_wgmma import _load_record, words_layout


@triton.jit
def stream_xor(p, out, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for off in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        acc ^= tl.load(p + off + tl.arange(0, BLOCK))
    tl.store(out + pid * BLOCK + tl.arange(0, BLOCK), acc)


@gluon.jit
def records_only(rec, out, RB, KT, BN: gl.constexpr):
    """The W12 kernel's loop with the rebuild and the dot replaced by an XOR of the words."""
    WL: gl.constexpr = words_layout(BN)
    p = gl.program_id(0)
    P = gl.num_programs(0)
    W = RB * KT
    w = (p * W) // P
    end = ((p + 1) * W) // P
    wr = gl.arange(0, BN, layout=gl.SliceLayout(1, WL))
    wp = gl.arange(0, 8, layout=gl.SliceLayout(0, WL))
    acc = gl.zeros([BN, 8], gl.int32, WL)
    while w < end:
        rb = w // KT
        n0 = rb * BN
        chunk = (n0 % 128 + wr)[:, None] * 8 + wp[None, :]
        base = rec + (n0 // 128).to(gl.int64) * KT * 3072
        k1 = gl.minimum(end - rb * KT, KT)
        k0 = w - rb * KT
        ra = _load_record(base + k0 * 3072, chunk, k0 < k1)
        rb_ = _load_record(base + (k0 + 1) * 3072, chunk, k0 + 1 < k1)
        for kt in range(k0, k1, 2):
            acc ^= ra[0] ^ ra[1] ^ ra[2]
            ra = _load_record(base + (kt + 2) * 3072, chunk, kt + 2 < k1)
            acc ^= rb_[0] ^ rb_[1] ^ rb_[2]
            rb_ = _load_record(base + (kt + 3) * 3072, chunk, kt + 3 < k1)
        w = (rb + 1) * KT
    gl.store(out + p * BN * 8 + wr[:, None] * 8 + wp[None, :], acc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, (n, k) in {"gate_up": (34816, 5120), "qkv": (10240, 5120)}.items():
        nt, kt = -(-n // 128), -(-k // 64)
        rot = 2
        recs = [
            torch.randint(-(2**31), 2**31 - 1, (nt, kt, 3072), dtype=torch.int32, device="cuda")
            for _ in range(rot)
        ]
        nbytes = recs[0].numel() * 4
        row = {"layer": name, "bytes": nbytes}
        row["torch_sum_us"] = timed([lambda r=r: r.sum() for r in recs], graph=True)
        best = (1e9, None)
        for block in (1024, 2048, 4096):
            for warps in (4, 8):
                for per_sm in (1, 2, 4, 8):
                    progs = sms * per_sm
                    out = torch.empty(progs * block, dtype=torch.int32, device="cuda")
                    fns = [
                        lambda r=r, o=out, b=block, w=warps, g=progs: stream_xor[(g,)](
                            r, o, r.numel(), BLOCK=b, num_warps=w
                        )
                        for r in recs
                    ]
                    us = timed(fns, graph=True)
                    best = min(best, (us, (block, warps, per_sm)))
        row["triton_stream_us"], row["triton_stream_config"] = best
        best = (1e9, None)
        for per_sm in (2, 3, 4, 6, 8):
            progs = sms * per_sm
            out = torch.empty(progs * 128 * 8, dtype=torch.int32, device="cuda")
            fns = [
                lambda r=r, o=out, g=progs, a=nt, b=kt: records_only[(g,)](r, o, a, b, BN=128, num_warps=4)
                for r in recs
            ]
            best = min(best, (timed(fns, graph=True), per_sm))
        row["records_only_us"], row["records_only_per_sm"] = best
        for key in ("torch_sum_us", "triton_stream_us", "records_only_us"):
            row[key.replace("_us", "_TBps")] = nbytes / row[key] / 1e6
        rows.append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "w12_stream.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
