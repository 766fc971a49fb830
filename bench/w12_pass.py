"""The refspec-w12 entry's pass against stock's on a read-bound target (wide-h200's, issue 41):
device time of the captured pass by rows, bytes read, and the argmax of both passes compared.

    python3 bench/w12_pass.py --model FOLDER [--rows 1,9] [--rounds 3] --json OUT   # on the device

The entry's tree is built from the built-in bundle (stock + its delta) and imported as `refspec`;
one engine loads the synthetic model (weights drawn on the device), is timed as stock, then the
entry's setup converts its weights to W12 and it is timed again; the bf16 layers are kept aside,
so the rounds alternate stock / W12 on the same model, same process (A B A B ...). A pass is
timed as in bench/refspec_wide.py: the bucket's graph, 5 × 20 replays, CUDA events, median.
`floor_ms` is the bytes a pass reads over the device's peak bandwidth.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(
    0, str(ROOT)
)  # tests.refspec.tree_entry builds the entry (`specpilot` on PYTHONPATH: gpu_env.sh)
sys.path.insert(0, str(ROOT / "bench"))

from refspec_wide import PEAK, time_pass  # noqa: E402


def profile_pass(model, use, kind: str, seq: list[int], ctx: int) -> dict[str, float]:
    """Device µs of each kernel (by name, summed) in a one-row pass launched eagerly, mean of 5."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    use(kind)
    model.eager = True
    model.prefill(seq[:ctx], 0)
    args = (seq[ctx : ctx + 1], [ctx], ctx, None)
    model.verify(*args)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            model.verify(*args)
        torch.cuda.synchronize()
    model.eager = False
    return {e.key: e.device_time_total / 5 for e in prof.key_averages() if e.device_time_total > 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", default="1,9")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--profile", action="store_true", help="also each kernel's device µs a one-row pass (eager)"
    )
    ap.add_argument("--variants", default="[]",
                    help='JSON list of W12 tile overrides to time too, e.g. [{"GATE_UP": {"BK": 64}}] (not QKV BH or '
                         "GATE_UP BN: the pair blocks are fixed at conversion)")  # fmt: skip
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    variants = json.loads(args.variants)

    from tests.refspec.tree_entry import checkout_entry

    tree = checkout_entry(Path(tempfile.mkdtemp()) / "tree", "refspec-w12")
    sys.path.insert(0, str(tree))
    import torch
    from refspec.config import load_config
    from refspec.cuda_graphs import CudaModel
    from refspec.ext import w12
    from refspec.runtime import open_engine
    from refspec.w12tiles.model import W12CudaModel
    from refspec.w12tiles.tiles import TileWeight

    t0 = time.perf_counter()
    config = load_config()
    config.ext["w12"] = {"enabled": False}
    engine = open_engine("cuda:0", args.model, None, config)
    model = engine.model
    load_s = time.perf_counter() - t0
    a = model.args
    bf16_layers = model.layers
    kv = 2 * a.layers * 2 * a.kv_heads * a.head_dim * args.context
    stock_bytes = 2 * sum(t.numel() for layer in model.layers for t in layer) + 2 * model.head.numel() + kv
    t1 = time.perf_counter()
    w12.setup(engine, w12.Knobs(enabled=True))
    setup_s = time.perf_counter() - t1
    w12_layers = model.layers
    head_bytes = model.head_w12.nbytes() if model.head_w12 is not None else 2 * model.head.numel()
    w12_bytes = kv + head_bytes + sum(
        (t.nbytes() if isinstance(t, TileWeight) else 2 * t.numel())
        for layer in model.layers for t in layer)  # fmt: skip

    w12_cfg = model.w12_cfg

    def use(kind: str) -> None:
        model.__class__ = CudaModel if kind == "stock" else W12CudaModel
        model.layers = bf16_layers if kind == "stock" else w12_layers
        model.w12_asm = kind != "w12_triton"
        v = variants[int(kind[1:])] if kind.startswith("v") else {}
        model.w12_cfg = {n: d | v.get(n, {}) for n, d in w12_cfg.items()}  # (stock's kernels read model.cfg)
        model.graphs.clear()

    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK.items() if k in name), None)
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 49152, (args.context + 64,), generator=g).tolist()
    rows = [int(x) for x in args.rows.split(",")]
    # w12_triton: the plain-Triton rebuild (same bits) in place of the PTX; v<i>: W12 with variants[i]'s tiles
    kinds = ("stock", "w12", "w12_triton", *(f"v{i}" for i in range(len(variants))))
    times: dict[str, dict[int, list[float]]] = {k: {r: [] for r in rows} for k in kinds}
    same = True
    for _ in range(args.rounds):
        for kind in kinds:
            use(kind)
            for r in rows:
                times[kind][r].append(time_pass(model, r, seq, args.context))
        for r in rows:  # both passes' argmax on the same rows
            outs = []
            for kind in kinds:
                use(kind)
                model.prefill(seq[: args.context], 0)
                outs.append(model.verify(seq[args.context : args.context + r], list(range(args.context, args.context + r)),
                                         args.context, None))  # fmt: skip
            same &= all(o == outs[0] for o in outs)
    out = {"device": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "model": args.model, "context": args.context, "load_s": load_s, "w12_setup_s": setup_s,
           "stock_bytes": stock_bytes, "w12_bytes": w12_bytes, "byte_ratio": w12_bytes / stock_bytes,
           "argmax_equal": same, "variants": variants, "rows": {}}  # fmt: skip
    for r in rows:
        s, w = statistics.median(times["stock"][r]), statistics.median(times["w12"][r])
        out["rows"][r] = {"stock_ms": s, "w12_ms": w, "speedup": s / w, "stock_runs": times["stock"][r],
                          "w12_runs": times["w12"][r], "w12_triton_ms": statistics.median(times["w12_triton"][r]),
                          "variants_ms": [statistics.median(times[f"v{i}"][r]) for i in range(len(variants))],
                          "stock_floor_ms": 1e3 * stock_bytes / peak if peak else None,
                          "w12_floor_ms": 1e3 * w12_bytes / peak if peak else None}  # fmt: skip
        print(r, json.dumps(out["rows"][r]), flush=True)
    if args.profile:
        out["kernels_us"] = {kind: profile_pass(model, use, kind, seq, args.context) for kind in kinds[:2]}
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
