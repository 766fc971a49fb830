"""Device µs of refspec's persistent pass for a copy of the refspec package: kernel variants side by side.

    python bench/refspec_pass_variants.py --tree DIR --name NAME [--stages N] [--skip BITS] --json OUT

DIR holds a `refspec` package (and its refspec.toml): the checkout's (deployments/stock/refspec) or a
variant's copy. On random weights of SmolLM2-135M's shapes (a pass's time does not depend on the
values), context 300: the pass of 1, 9, 16 and 17 rows captured as one CUDA graph [zero the
counters, the kernel], 30 replays to warm up, then 5 runs of 100 replays timed with CUDA events; the
median run's µs per pass. Run each variant in its own process, the shipped tree first and last, in
one device call (bench/refspec_ptx.py checks a variant's registers and spills first, with no GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=ROOT / "deployments" / "stock" / "refspec")
    ap.add_argument("--name", default="shipped")
    ap.add_argument("--stages", type=int, help="num_stages (default: the tree's PERSIST)")
    ap.add_argument("--skip", type=int, default=0, help="decode_pass's SKIP bits (phases left out)")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT / "bench"))
    # refspec_floor puts the checkout's refspec on sys.path: the variant goes before it
    from refspec_floor import graph_us, random_engine

    tree = str(args.tree.resolve())
    sys.path.insert(0, tree)
    import refspec
    import torch
    from refspec import cuda_persist
    from refspec.cuda_graphs import PERSIST

    if not refspec.__file__.startswith(tree):
        sys.exit(f"refspec_pass_variants: imported refspec from {refspec.__file__}, not from {tree}")
    engine, prompts = random_engine(args.context, 1)
    m, ctx = engine.model, args.context
    seq = (prompts[0] * 20)[: ctx + 20]
    m.prefill(seq[:ctx], 0)
    cfg = PERSIST | ({"num_stages": args.stages} if args.stages else {})
    out = {"variant": args.name, "tree": tree, "config": cfg, "skip": args.skip, "context": ctx,
           "device": torch.cuda.get_device_name(0)}  # fmt: skip
    for rows in (1, 9, 16, 17):
        m.verify(seq[ctx : ctx + rows], list(range(ctx, ctx + rows)), ctx, None)  # the pass's inputs
        n = -(-rows // 16) * 16

        def body(n: int = n) -> None:
            m.bar.zero_()
            cuda_persist.launch(m, n, True, cfg, args.skip)

        runs = graph_us(body, runs=5, per=100, warm=30)
        out[f"rows_{rows}_us"] = statistics.median(runs)
        out[f"rows_{rows}_us_runs"] = runs
    print(json.dumps({k: v for k, v in out.items() if not k.endswith("_runs")}))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
