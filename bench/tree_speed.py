"""Screening: wall time of tree verification vs the stock chain, in one process on one core.

    python bench/tree_speed.py --requests REQUESTS.jsonl [--device cpu:0] [--prompts 8]
        [--max-new-tokens 96] [--nodes 8,16,32] [--block-size 8] [--json OUT]
        [--entry-tree DIR] [--model NAME_OR_FOLDER]

Builds the built-in bundle's `refspec-tree-verify` entry from stock (as `memory replay` does),
imports its refspec package, and decodes each HumanEval request with `verify = "chain"` (stock's
code path) and with the tree at each node count, one after the other per prompt (order reversed
on every other prompt, so load drifting during the run hits all alike). Checks that every output
equals the chain's. This is a screen for choosing node counts; the verdict comes from the
controller's paired runs (`specpilot controller compare`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ENTRY = "refspec-tree-verify"


def entry_tree(out: Path) -> Path:
    """Stock + the entry's delta, built as `memory replay` builds it (needs SpecPilot installed)."""
    from specpilot.deployments.stock import stock_tree_path
    from specpilot.memory_store import StockTree, builtin_bundles, read_bundle
    from specpilot.memory_store.stacking import Stacker

    entry = {e.name: e for e in read_bundle(builtin_bundles()["refspec"])}[ENTRY]
    with Stacker() as st:
        stock = st.stock_hash(StockTree("refspec", stock_tree_path("refspec"), "refspec (built-in)"))
        st.checkout(st.build(stock, [entry]), out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=Path, required=True)
    ap.add_argument("--device", default="cpu:0")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--nodes", default="8,16,32")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--entry-tree", type=Path, help="the entry's tree, already built (`memory replay`)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or HF folder")
    ap.add_argument("--warm-prompts", type=int, default=0, help="untimed prompts through every system first")
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="tree-speed-")
    root = args.entry_tree or entry_tree(Path(tmp.name) / "tree")
    sys.path.insert(0, str(root))
    from refspec.config import load_config
    from refspec.generate import Engine, greedy
    from refspec.runtime import open_engine, warm_up

    base = load_config()
    engine = open_engine(args.device, args.model, None, base)  # pins a CPU slot
    reqs = [json.loads(x) for x in args.requests.read_text().splitlines() if x.strip()]
    prompts = [r["input_ids"] for r in reqs if r.get("set", "humaneval") == "humaneval"][: args.prompts]
    n = args.max_new_tokens

    systems = {"chain": {"verify": "chain"}}
    systems |= {f"tree{k}": {"verify": "tree", "tree_nodes": int(k)} for k in args.nodes.split(",")}
    engines = {}
    for name, knobs in systems.items():
        config = load_config()
        config.decode = dataclasses.replace(config.decode, block_size=args.block_size, **knobs)
        engines[name] = Engine(engine.model, config)
        warm_up(engines[name])
    # One-time costs (allocator growth, kernel selection for new shapes) land on whichever system
    # meets a shape first; a GPU run pays seconds of them, so warm every system on real prompts.
    for prompt in prompts[: args.warm_prompts]:
        for name in systems:
            greedy(engines[name], prompt, n, "spec")
    wall = dict.fromkeys(systems, 0.0)
    steps = dict.fromkeys(systems, 0)
    rows = dict.fromkeys(systems, 0)
    for i, prompt in enumerate(prompts):
        order = list(systems) if i % 2 == 0 else list(systems)[::-1]
        outs = {}
        for name in order:
            t = time.perf_counter()
            outs[name], stats = greedy(engines[name], prompt, n, "spec")
            wall[name] += time.perf_counter() - t
            steps[name] += stats.steps
            rows[name] += stats.rows
        same = all(o == outs["chain"] for o in outs.values())
        print(
            f"prompt {i}: same output {same}; " + ", ".join(f"{k} {wall[k]:.1f}s" for k in systems),
            flush=True,
        )
    result = {
        "device": args.device,
        "prompts": len(prompts),
        "max_new_tokens": n,
        "block_size": args.block_size,
        "load_average": os.getloadavg(),
        "systems": {
            k: {
                "wall_s": wall[k],
                "tau": len(prompts) * n / steps[k],
                "rows_per_step": rows[k] / steps[k],
                "speed_vs_chain": wall["chain"] / wall[k],
            }
            for k in systems
        },
    }
    for k, v in result["systems"].items():
        print(
            f"{k:>7}: wall {v['wall_s']:.1f}s  τ {v['tau']:.3f}  rows/step {v['rows_per_step']:.2f}  "
            f"speed vs chain {v['speed_vs_chain']:.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
