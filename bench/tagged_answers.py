"""How often a judged prompt's secret tag changes stock's answer (issue 39, controller/context.py).

    python bench/tagged_answers.py [--deployment smollm-cpu] [--prompts 24] [--seed 0] [--json OUT]
                                   [--variant '{turn}\n(ref {tag})']

Samples prompts from the deployment's public pool, renders each as the controller judges it (under
a random tag, `workloads.judged_prompts`) and as published (the pool's ids), runs stock refspec's
greedy decoding on both in this process (one CPU thread, the deployment's max_new_tokens), and
reports the share of answers that differ and where they first differ. An answer the tag does not
change is one a candidate could ship in advance for that prompt: the share unchanged is what tags
leave open. `--variant` renders the tag another way (a format of `tag` and `turn`; default the
controller's own, `workloads.VARIANT`), to see which form leaves the fewest answers unchanged.
Times nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

import torch

from specpilot.deployments import Home, load_deployment
from specpilot.deployments.stock import import_refspec
from specpilot.deployments.workloads import VARIANT, judged_prompts, load_requests, pool_file


def stock_engine():
    """Stock refspec's CPU engine on SmolLM2 (fp32, one thread, stock's knobs), in this process."""
    import_refspec()
    from refspec.config import load_config
    from refspec.generate import Engine
    from refspec.model import load_model
    from refspec.weights import SMOLLM2, resolve_model

    torch.set_num_threads(1)
    config = load_config()
    return Engine(load_model(resolve_model(SMOLLM2), torch.device("cpu"), torch.float32,
                             config.runtime.cpu_layout), config)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="smollm-cpu")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--variant", default=VARIANT, help="how a tag is put into the first turn (\\n: a newline)"
    )
    args = ap.parse_args()
    args.variant = args.variant.replace("\\n", "\n")
    engine = stock_engine()
    from refspec.generate import greedy

    home = Home.resolve(None)
    dep = load_deployment(args.deployment, home)
    rng = random.Random(args.seed)
    pool = rng.sample(load_requests(pool_file(dep, home)), args.prompts)
    tags = [f"{rng.getrandbits(32):08x}" for _ in pool]
    tagged = judged_prompts(dep, home, [(r.id, t) for r, t in zip(pool, tags, strict=True)], args.variant)
    rows = []
    for r, tag, ids in zip(pool, tags, tagged, strict=True):
        public = greedy(engine, r.input_ids, r.max_new_tokens)[0]
        answer = greedy(engine, ids, r.max_new_tokens)[0]
        first = next((i for i, (a, b) in enumerate(zip(answer, public, strict=True)) if a != b), None)
        rows.append({"pool_id": r.id, "tag": tag, "tokens": r.max_new_tokens, "first_difference": first})
        print(
            f"{r.id:16s} {tag}  {'unchanged' if first is None else f'differs from token {first}'}", flush=True
        )
    changed = [x["first_difference"] for x in rows if x["first_difference"] is not None]
    summary = {"deployment": dep.name, "variant": args.variant, "prompts": len(rows), "changed": len(changed),
               "median_first_difference": statistics.median(changed) if changed else None}  # fmt: skip
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
