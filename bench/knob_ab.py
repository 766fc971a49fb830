"""In-process A/B of one refspec knob on one core: stock's value against another, prompt by prompt.

    python bench/knob_ab.py --knob drafter.min_ngram --value 2 [--prompts 16] [--max-new-tokens 64] [--repeats 3]

One process, one core (cpu:0, one torch thread), the same weights: two engines differing only in
the knob serve the same HumanEval prompts of smollm-cpu's workload in ABBA order, so a drift of the
core's speed cancels pair by pair. Reports per engine τ, rows per step and seconds, and the time
ratio stock / variant (geometric mean over prompts and repeats); outputs are compared token for
token. A cross-check of the controller's verdict with none of its machinery (no processes, no
slicing), not a verdict. Results go into docs/BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--knob", required=True, help="section.name of refspec.toml, e.g. drafter.min_ngram")
    parser.add_argument("--value", required=True, type=int)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from specpilot.deployments import Home, load_deployment
    from specpilot.deployments.workloads import load_requests, request_file

    dep = load_deployment("smollm-cpu")
    dep = dep.model_copy(
        update={"workload": dep.workload.model_copy(update={"sets": {"humaneval": args.prompts}})}
    )
    prompts = [r.input_ids for r in load_requests(request_file(dep, Home.resolve())) if r.set == "humaneval"]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deployments" / "stock" / "refspec"))
    from refspec.config import load_config
    from refspec.generate import Engine, greedy
    from refspec.runtime import open_engine
    from refspec.weights import SMOLLM2

    config = load_config()
    stock = open_engine("cpu:0", SMOLLM2, None, config)  # pins this process first
    section, name = args.knob.split(".")
    varied = copy.deepcopy(config)
    setattr(getattr(varied, section), name, args.value)
    engines = {"stock": stock, "variant": Engine(stock.model, varied)}
    greedy(stock, prompts[0], 8)
    logs, out = [], {k: {"s": 0.0, "steps": 0, "rows": 0, "tokens": 0} for k in engines}
    same = 0
    for rep in range(args.repeats):
        for i, p in enumerate(prompts):
            order = ["stock", "variant"] if (i + rep) % 2 == 0 else ["variant", "stock"]
            got = {}
            for k in order:
                t = time.perf_counter()
                toks, st = greedy(engines[k], p, args.max_new_tokens)
                dt = time.perf_counter() - t
                got[k] = (toks, dt)
                o = out[k]
                o["s"] += dt
                o["steps"] += st.steps
                o["rows"] += st.rows
                o["tokens"] += len(toks)
            logs.append(math.log(got["stock"][1] / got["variant"][1]))
            same += got["stock"][0] == got["variant"][0]
    n = len(logs)
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    summary = {
        "knob": args.knob, "value": args.value, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "speedup": math.exp(mean), "speedup_se": sd / math.sqrt(n), "same_output": f"{same}/{n}",
        "engines": {k: {"tau": o["tokens"] / o["steps"], "rows_per_step": o["rows"] / o["steps"],
                        "tokens_per_s": o["tokens"] / o["s"]} for k, o in out.items()},
    }  # fmt: skip
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
