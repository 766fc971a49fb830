"""refspec's CUDA pass on a read-bound target (deployment wide-h200, issue 41): device time by rows
for the pass as stock runs it and for tile variants of its per-phase kernels, against the byte floor.

    python3 bench/refspec_wide.py --model FOLDER [--rows 1,9] [--variants all] --json OUT   # on the device

The model is a synthetic folder (refspec/synthetic.py; weights drawn on the device). Each variant
sets the per-phase kernels' tiles (CudaModel.cfg), captures the pass of a bucket as one
CUDA graph (input copy, the kernels, output copy) at a context of --context slots and times 5 × 20
replays with CUDA events (median). `floor_ms` is the bytes one pass reads (every weight once, the
K/V prefix) over the device's peak bandwidth (H200 4.8 TB/s, H100 3.35 TB/s); the cost model's floor
divides by 0.9 of that.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "deployments" / "stock" / "refspec"))

PEAK = {"H200": 4.8e12, "H100": 3.35e12}
# name -> {tile dict: overrides} on the model's own tiles (CudaModel.cfg); "stock" is the tree as it is,
# "latency" the persistent pass's tiles (what the per-phase kernels ran before READ_BOUND).
VARIANTS = {
    "stock": {},
    "latency": {"LIN_O": {"BN": 16, "BK": 64}, "GATE_UP": {"BN": 16, "BK": 64}, "LIN_DOWN": {"BN": 16, "BK": 128},
                "HEAD": {"BK": 64}},
    "bk256": {"LIN_O": {"BK": 256}, "GATE_UP": {"BK": 256}, "LIN_DOWN": {"BK": 256}, "HEAD": {"BK": 256}},
    "bn64": {"LIN_O": {"BN": 64}, "GATE_UP": {"BN": 64}, "LIN_DOWN": {"BN": 64}},
    "qkv_bk128": {"QKV": {"BK": 128}},
    "stages4": {"LIN_O": {"num_stages": 4}, "GATE_UP": {"num_stages": 4}, "LIN_DOWN": {"num_stages": 4},
                "HEAD": {"num_stages": 3}},
    "persistent": {},  # the one-launch pass (cuda_persist.py, its own tiles) in place of the per-phase kernels
    "bn32_w2": {"LIN_O": {"num_warps": 2}, "GATE_UP": {"num_warps": 2}, "LIN_DOWN": {"num_warps": 2}},
}  # fmt: skip


def pass_bytes(a, context: int) -> int:
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    weights = a.layers * a.hidden * (q + 2 * kv + q + 3 * a.intermediate) + a.vocab * a.hidden
    return 2 * (weights + a.layers * 2 * kv * context)


def time_pass(model, rows: int, seq: list[int], ctx: int) -> float:
    """Median device ms of the captured pass of `rows` rows at context ctx (fresh graphs)."""
    import torch

    model.graphs.clear()
    model.prefill(seq[:ctx], 0)
    args = (seq[ctx : ctx + rows], list(range(ctx, ctx + rows)), ctx, None)
    model.verify(*args)
    meds = []
    for _ in range(5):
        model.timing = []
        for _ in range(20):
            model.verify(*args)
        torch.cuda.synchronize()
        meds.append(statistics.median(a.elapsed_time(b) for a, b in model.timing))
        model.timing = None
    return statistics.median(meds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", default="1,9")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--variants", default="all")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch
    from refspec.config import load_config
    from refspec.runtime import open_engine

    t0 = time.perf_counter()
    engine = open_engine("cuda:0", args.model, None, load_config())
    model = engine.model
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK.items() if k in name), None)
    a = model.args
    nbytes = pass_bytes(a, args.context)
    out = {"device": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load_s": time.perf_counter() - t0, "persistent": model.persistent, "context": args.context,
           "pass_bytes": nbytes, "floor_ms": 1e3 * nbytes / peak if peak else None, "variants": {}}  # fmt: skip
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 49152, (args.context + 64,), generator=g).tolist()
    names = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    saved, stock_persistent = {k: dict(d) for k, d in model.cfg.items()}, model.persistent
    for v in names:
        model.cfg = {k: d | VARIANTS[v].get(k, {}) for k, d in saved.items()}
        model.persistent = v == "persistent" or (v == "stock" and stock_persistent)
        res = {"tiles": {k: model.cfg[k] for k in VARIANTS[v]}}
        try:
            for r in (int(x) for x in args.rows.split(",")):
                ms = time_pass(model, r, seq, args.context)
                res[r] = {"device_ms": ms, "of_floor": out["floor_ms"] / ms if peak else None}
        except Exception as e:  # a tile that does not fit: say so, go on
            res["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        out["variants"][v] = res
        print(v, json.dumps(res), flush=True)
    model.cfg, model.persistent = saved, stock_persistent
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
