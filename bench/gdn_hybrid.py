"""The refspec-gdn-tree entry end to end on a hybrid model: stock chain vs tree (path, WY) against AR.

    python bench/gdn_hybrid.py --tree <checkout of refspec-gdn-tree> --device cuda:0 --out OUT.json

The entry's tree holds stock (its mechanisms off = stock's code paths) and the two mechanisms, so
one package serves every system. The model is refspec/hybrid.py's GDN/attention hybrid with random
weights: Qwen3.8-27B's layer shapes (hidden 5120, GDN 16 key / 48 value heads of 128, attention 32
heads of 256 over 4 KV heads, MLP 17408), `--layers` layers (3 GDN : 1 attention) and a small
vocabulary (`--vocab`, 256: the random model's greedy text then loops, so drafts are accepted; the
real 248k head would add the same cost to every system). Greedy decoding of a repeating prompt;
outputs are compared with AR token for token (in bf16 a random model's logits are near ties
everywhere, so bf16 differences between pass shapes flip some; `--dtype float32` shows the rule
itself), τ and wall time per request are reported (eager torch, one request).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

QWEN_LAYER = {"hidden": 5120, "intermediate": 17408, "heads": 32, "kv_heads": 4, "head_dim": 256,
              "gdn_key_heads": 16, "gdn_value_heads": 48, "gdn_head_dim": 128}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, required=True, help="a checkout of the refspec-gdn-tree entry")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="a small shape (CPU smoke run)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument(
        "--vocab",
        type=int,
        default=256,
        help="a small vocabulary makes the random model's greedy text loop, so drafts are accepted",
    )
    ap.add_argument(
        "--copy",
        action="store_true",
        help="tie the head to the embedding: the model then repeats its input token, drafts are "
        "accepted up to the block and every commit replays a long path",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    import torch
    from refspec import ext
    from refspec.config import load_config
    from refspec.generate import Engine, greedy
    from refspec.hybrid import HybridArgs, HybridModel, random_state

    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if dev.type == "cuda" else torch.float32
    shape = {} if args.small else QWEN_LAYER
    hargs = HybridArgs(layers=args.layers, **(shape | {"vocab": args.vocab}))
    t0 = time.perf_counter()
    model = HybridModel(hargs, random_state(hargs, 0), dev, dtype)
    build_s = time.perf_counter() - t0
    if args.copy:
        model.head = model.embed
    prompt = [5, 9, 17, 3, 22, 9, 17, 3, 41, 5, 9, 17, 3, 22, 9, 17, 3, 41, 5, 9] * 4

    def engine(tree: bool, method: str = "path"):
        cfg = load_config()
        cfg.ext["tree"] = {**cfg.ext["tree"], "enabled": tree, "nodes": args.nodes}
        cfg.ext["gdn_tree"] = {**cfg.ext["gdn_tree"], "enabled": tree, "method": method}
        model.gdn_tree = None
        return Engine(model, cfg, ext.load(cfg))

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    systems = {"ar": (False, "path", "ar"), "chain": (False, "path", "spec"), "tree_path": (True, "path", "spec"),
               "tree_wy": (True, "wy", "spec")}  # fmt: skip
    result = {"copy": args.copy, "dtype": args.dtype, "vocab": args.vocab, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "layers": args.layers, "gdn_layers": len(model.gdn_index), "nodes": args.nodes, "tokens": args.tokens,
              "fla_core_stock": model.fla is not None, "build_s": round(build_s, 1), "systems": {}}  # fmt: skip
    ar_out = None
    for name, (tree, method, mode) in systems.items():
        e = engine(tree, method)
        greedy(e, prompt, 8, mode=mode)  # warm-up (Triton compiles)
        times, out, stats = [], None, None
        for _ in range(args.repeats):
            sync()
            t = time.perf_counter()
            out, stats = greedy(e, prompt, args.tokens, mode=mode)
            sync()
            times.append(time.perf_counter() - t)
        ar_out = out if name == "ar" else ar_out
        result["systems"][name] = {"tau": round(stats.tau, 3), "steps": stats.steps, "wall_s": round(statistics.median(times), 3),
                                   "equals_ar": out == ar_out}  # fmt: skip
        print(name, result["systems"][name], flush=True)
    base = result["systems"]["chain"]["wall_s"]
    for s in result["systems"].values():
        s["speed_vs_chain"] = round(base / s["wall_s"], 3)
    print(json.dumps(result), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
