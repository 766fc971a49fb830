"""W12 against cuBLAS as a decode step runs them: the projections of L layers back to back in one
CUDA graph, no flush between them (by hand, on a GPU):

    PYTHONPATH=. python bench/w12_chain.py --layers 8 --out DIR

Llama-3.1-8B's fused projections (qkv 6144 x 4096, o 4096 x 4096, gate_up 28672 x 4096, down
4096 x 14336), random trained-like weights, one x row per call. Times the whole chain (median of
CUDA-event pairs around graph replays; 8 layers = 3.5 GB of bf16, far beyond L2) and, for the
same weights, each GEMM alone with do_bench, so the two views can be compared.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from w12_gemm import SHAPES_8B, timed, weights
from w12_stream import replay_us

from specpilot.kernels.w12 import encode, w12_matmul


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    shapes = list(SHAPES_8B.items())
    ws = [[weights(n, k, 10 * i + j) for j, (_, (n, k)) in enumerate(shapes)] for i in range(args.layers)]
    ts = [[encode(w) for w in layer] for layer in ws]
    xs = {k: torch.randn(1, k, device="cuda").to(torch.bfloat16) for _, (_, k) in shapes}

    def chain_bf16():
        for layer in ws:
            for w in layer:
                torch.nn.functional.linear(xs[w.shape[1]], w)

    def chain_w12():
        for layer in ts:
            for t in layer:
                w12_matmul(xs[t.k_in], t)

    row = {"layers": args.layers, "gpu": torch.cuda.get_device_name(0)}
    row["chain_bf16_us"] = replay_us([chain_bf16], reps=50)
    row["chain_w12_us"] = replay_us([chain_w12], reps=50)
    row["chain_ratio"] = row["chain_bf16_us"] / row["chain_w12_us"]
    for j, (name, _) in enumerate(shapes):
        row[f"{name}_cublas_us"] = timed(
            [lambda w=layer[j]: torch.nn.functional.linear(xs[w.shape[1]], w) for layer in ws[:2]], graph=True
        )
        row[f"{name}_w12_us"] = timed(
            [lambda t=layer[j]: w12_matmul(xs[t.k_in], t) for layer in ts[:2]], graph=True
        )
    print(json.dumps(row, indent=1))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "w12_chain.json"), "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
