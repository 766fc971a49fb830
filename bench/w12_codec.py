"""W12 codec figures: bits/weight (everything counted), escape rate, encode/verify time (CPU).

    SPECPILOT_CACHE=/work/cache python bench/w12_codec.py

Shapes: the 27B-class projections with trained-like bf16 weights (tests/kernels/w12_data.py),
plain Gaussian weights, and every matrix of SmolLM2-135M-Instruct (bf16 of the converted fp32
weights, which are the Q4_1 GGUF dequantized).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "deployments" / "stock" / "refspec"))

from kernels.w12_data import trained_like  # noqa: E402

from specpilot.kernels.w12 import encode, verify  # noqa: E402

SHAPES = {"qkv": (10240, 5120), "o": (5120, 8192), "gate_up": (34816, 5120), "down": (5120, 17408)}


def row(name: str, w: torch.Tensor) -> tuple[int, int, int]:
    t0 = time.perf_counter()
    t = encode(w)
    t1 = time.perf_counter()
    verify(t, w)
    t2 = time.perf_counter()
    s = t.stats()
    print(
        f"{name:28s} {s['n_out']:>6d}x{s['k_in']:<6d} bits/w {s['bits_per_weight']:.4f}  escapes {s['escape_rate']:.2e}"
        f"  encode {t1 - t0:5.1f} s  verify {t2 - t1:5.1f} s",
        flush=True,
    )
    return w.numel(), t.nbytes(), t.n_escapes


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    for name, (n, k) in SHAPES.items():
        row(f"trained-like {name}", trained_like(n, k, seed=n))
    g = torch.Generator().manual_seed(0)
    row("gaussian qkv", (torch.randn(10240, 5120, generator=g) * 0.02).bfloat16())

    from refspec.weights import resolve_model
    from safetensors.torch import load_file

    folder = resolve_model("smollm2-135m-instruct", Path(os.environ["SPECPILOT_CACHE"]))
    tot = [0, 0, 0]
    for name, w in load_file(str(folder / "model.safetensors")).items():
        if w.dim() == 2 and (".layers.0." in name or "embed" in name):  # print layer 0 and the embedding
            r = row(f"smollm2 {name.replace('model.', '')}", w.bfloat16())
        elif w.dim() == 2:
            t = encode(w.bfloat16())
            r = (w.numel(), t.nbytes(), t.n_escapes)
        else:
            continue
        tot = [a + b for a, b in zip(tot, r, strict=True)]
    print(f"smollm2 all matrices: bits/w {8 * tot[1] / tot[0]:.4f}  escapes {tot[2] / tot[0]:.2e}")


if __name__ == "__main__":
    main()
