"""W12 GEMM calls to profile with Nsight Compute (run by hand on a GPU, from bench/):

    ncu -k regex:w12_gemm_kernel --launch-skip 2 -c 1 --section SpeedOfLight \
        --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
        python w12_ncu.py --shape gate_up --m 1 '{"block_n": 128, "split": 4, "rpi": 2, "xa": true}'

Each config (GemmConfig fields as JSON, positional) runs three times, so `--launch-skip 2 -c 1`
profiles a call whose kernel is already compiled; `--cublas` first runs cuBLAS three times.
"""

from __future__ import annotations

import argparse
import json

import torch
from w12_gemm import SHAPES, weights  # bench/ is on sys.path when run as a script

from specpilot.kernels.w12 import GemmConfig, encode, w12_matmul


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="gate_up")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("configs", nargs="*", help="GemmConfig fields as JSON, one per config")
    ap.add_argument("--cublas", action="store_true", help="also run torch.nn.functional.linear on the bf16 W")
    args = ap.parse_args()
    n, k = SHAPES[args.shape]
    w = weights(n, k, 0)
    t = encode(w)
    x = torch.randn(args.m, k, device="cuda").to(torch.bfloat16)
    if args.cublas:
        for _ in range(3):
            torch.nn.functional.linear(x, w)
    for c in args.configs:
        cfg = GemmConfig(**json.loads(c))
        for _ in range(3):
            w12_matmul(x, t, config=cfg)
        torch.cuda.synchronize()
        print(cfg, flush=True)


if __name__ == "__main__":
    main()
