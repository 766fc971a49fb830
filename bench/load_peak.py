"""Peak memory of refspec's CUDA model while it loads, and while `refspec-w12` converts it.

    python bench/load_peak.py --tree DIR [--layers 4] [--hidden 1024] [--device cuda:0] [--json OUT]
    python bench/load_peak.py --matrix 65536x1024 [--device cuda:0]     # kernels/w12's tile_weight alone

DIR is a refspec tree holding the W12 entry (`specpilot memory replay -d wide-h200 --entries
refspec-w12 --out DIR`). The target is synthetic (refspec/synthetic.py: wide27b-8l's layout at
`--hidden`, intermediate 4·hidden, head_dim 128, 8:1 query to KV heads, an untied head of vocab
8·hidden), drawn in bf16 on the host. Figures are bytes over the weights' bytes W:
- `load_peak`: the most memory `CudaModel(...)` held beyond the host state while it built its
  weights (per-layer tensors, concatenations, the per-kind stacks), and `load_after` what it keeps;
- `convert_peak` / `convert_after`: the same for `w12tiles.model.convert` from the loaded model.
On CUDA: the allocator's peak (`torch.cuda.max_memory_allocated`). On a CPU device (the kernels'
Triton must import: put the Triton wheel on PYTHONPATH; nothing launches) the process's resident
set, sampled every 0.5 ms by a thread. The per-phase path is forced (PERSIST_MAX_LAYER_BYTES = 0)
so convert runs at small shapes. `--matrix NxK` times nothing of refspec: the peak of
`tile_weight` on one trained-like bf16 matrix, whole (one band) against its default row bands.
Results go into docs/BENCHMARKS.md by hand, with command,
machine and date.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

from refspec_speed import machine


class Peak:
    """The most memory in use on `device` between start() and stop(), over what was in use at start()."""

    def __init__(self, device):
        self.device = device
        self.page = os.sysconf("SC_PAGE_SIZE")

    def used(self) -> int:
        import torch

        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device)
        return int(Path("/proc/self/statm").read_text().split()[1]) * self.page

    def start(self) -> None:
        import torch

        self.base = self.used()
        self.top, self.running = self.base, True
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while self.running:
            self.top = max(self.top, self.used())
            time.sleep(0.0005)

    def stop(self) -> tuple[int, int]:
        """(peak, now), each over the start's."""
        import torch

        self.running = False
        if self.device.type == "cuda":
            self.top = torch.cuda.max_memory_allocated(self.device)
        else:
            self.thread.join()
        now = self.used()
        return max(self.top, now) - self.base, now - self.base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=None, help="a refspec tree with refspec-w12")
    ap.add_argument("--matrix", default=None, help="NxK: tile_weight's peak on one matrix instead")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.matrix:
        return matrix_peak(args)
    if args.tree is None:
        ap.error("give --tree (a refspec tree with refspec-w12) or --matrix NxK")
    sys.path.insert(0, str(args.tree))
    import torch
    from refspec import cuda_graphs
    from refspec.model import ModelArgs
    from refspec.synthetic import synthetic_state
    from refspec.w12tiles.model import convert

    device = torch.device(args.device)
    h = args.hidden
    cfg = {"hidden_size": h, "intermediate_size": 4 * h, "num_hidden_layers": args.layers,
           "num_attention_heads": h // 128, "num_key_value_heads": max(h // 1024, 1), "head_dim": 128,
           "vocab_size": 8 * h, "tie_word_embeddings": False, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
           "max_position_embeddings": 1024, "model_type": "llama",
           "synthetic": {"seed": 0, "gain": 1.0, "row_spread": 2.0}}  # fmt: skip
    state = synthetic_state(cfg, torch.device("cpu"))
    weights = sum(t.numel() * t.element_size() for t in state.values())
    cuda_graphs.PERSIST_MAX_LAYER_BYTES = 0  # the per-phase path, which convert takes
    peak = Peak(device)
    peak.start()
    model = cuda_graphs.CudaModel(ModelArgs.from_hf(cfg), state, device, 256)
    load_peak, load_after = peak.stop()
    del state  # on a CPU device the model's embedding and norms may be the state's own tensors
    peak.start()
    kept = convert(model, head=True)
    convert_peak, convert_after = peak.stop()
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": machine(args.device),
        "config": {
            k: cfg[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")
        },
        "weights_bytes": weights,
        "load_peak": load_peak / weights,
        "load_after": load_after / weights,
        "convert_peak": convert_peak / weights,
        "convert_after": convert_after / weights,
        "kept_bf16": kept,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


def matrix_peak(args) -> None:
    import torch

    from specpilot.kernels.w12.tiles import TILE_N, tile_weight

    n, k = (int(x) for x in args.matrix.lower().split("x"))
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    scale = torch.exp2(torch.rand(n, 1, generator=g) * 2 - 8)  # per-row scales over 2 binades
    w = (torch.randn(n, k, generator=g) * scale).to(torch.bfloat16).to(device)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": machine(args.device),
              "matrix": [n, k], "matrix_bytes": w.numel() * 2}  # fmt: skip
    peak = Peak(device)
    for name, band in (("whole", -(-n // TILE_N) * TILE_N), ("banded", None)):
        peak.start()
        tw = tile_weight(w) if band is None else tile_weight(w, band_rows=band)
        top, after = peak.stop()
        result[name] = {"peak": top / result["matrix_bytes"], "after": after / result["matrix_bytes"]}
        del tw
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
