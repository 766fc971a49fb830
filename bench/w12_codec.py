"""W12 codec figures: bits/weight (everything counted), escape rate, encode/verify time (CPU).

    SPECPILOT_CACHE=/work/cache python bench/w12_codec.py
    python bench/w12_codec.py --worst [--json OUT]     (sizes of hostile distributions and shapes)

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

from kernels.w12_data import random_bits, trained_like  # noqa: E402

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


def worst(out: Path | None) -> None:
    """bits/weight of the distributions and shapes that cost the most (bit-exact round trip checked)."""
    g = torch.Generator().manual_seed(0)
    n, k = 1024, 1024
    tw = trained_like(n, k)
    cases = {
        "trained-like": tw,
        "all zeros": torch.zeros(n, k, dtype=torch.bfloat16),
        "all -0.0": torch.full((n, k), -0.0, dtype=torch.bfloat16),
        "30% zeros": torch.where(torch.rand(n, k, generator=g) < 0.3, 0.0, tw.float()).bfloat16(),
        "every bit pattern": random_bits(n, k),
        "all NaN": torch.full((n, k), float("nan"), dtype=torch.bfloat16),
        "all denormal": torch.full((n, k), 1e-39, dtype=torch.bfloat16),
        "log-uniform, all binades": (
            torch.exp2(torch.rand(n, k, generator=g) * 250 - 125) * torch.sign(torch.randn(n, k, generator=g))
        ).bfloat16(),
        "every 4th row random bits": torch.where(
            torch.arange(n)[:, None] % 4 == 0, random_bits(n, k).float(), tw.float()
        ).bfloat16(),  # fmt: skip
        "trained-like 129x65": trained_like(129, 65),
        "trained-like 192x576": trained_like(192, 576),
    }
    rows = []
    for name, w in cases.items():
        t = encode(w)
        verify(t, w)
        s = t.stats()
        rows.append({"case": name, "shape": list(w.shape), "bits_per_weight": round(s["bits_per_weight"], 4),
                     "escape_rate": s["escape_rate"], "raw_rows": s["raw_rows"]})  # fmt: skip
        print(f"{name:28s} {w.shape[0]:>5d}x{w.shape[1]:<5d} bits/w {s['bits_per_weight']:7.3f}  "
              f"escapes {s['escape_rate']:.2e}  raw rows {s['raw_rows']}")  # fmt: skip
    if out:
        import json

        out.write_text(json.dumps({"command": "python bench/w12_codec.py --worst", "rows": rows}, indent=1))


def main() -> None:
    if "--worst" in sys.argv:
        i = sys.argv.index("--json") if "--json" in sys.argv else -1
        return worst(Path(sys.argv[i + 1]) if i > 0 else None)
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
