"""Where the swapped design's A/A noise comes from, and whether lock-step turns remove it.

    python bench/swapped_schedule.py --deployment smollm-cpu --blocks 8 [--home DIR] [--json OUT]

Stock against a copy of stock (another tree hash, the same system), blocks alternating between the
two schedules of a swapped period: each system serving the whole request stream at its own pace
(`free`), or both starting every request together and the next waiting for both (`lockstep`). Per
schedule: the spread of the per-request log speed ratio inside a period (what one request's noise
is), the spread of period means against what independent requests would give, and the block sd
(what the verdict's σ is made of).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics as st
import time
from pathlib import Path

from specpilot.controller.adapters import adapter_for
from specpilot.controller.context import draw_requests, slots_of
from specpilot.controller.paired import paired_run
from specpilot.controller.slots import lease
from specpilot.controller.systems import checkout
from specpilot.deployments import Home, load_deployment
from specpilot.memory_store.workspace import Workspace


def summarize(run) -> dict:
    """Per-request log ratios (both periods of every block, each on its own slot pairing)."""
    within, period_means, blocks = [], [], []
    for blk in run.blocks:
        p0 = [math.log(r.b_s1 / r.a_s0) for r in blk]  # B on s1 against A on s0
        p1 = [math.log(r.b_s0 / r.a_s1) for r in blk]
        for p in (p0, p1):
            within.append(st.variance(p))
            period_means.append(st.mean(p))
        blocks.append(st.mean(r.log_ratio() for r in blk))
    n = len(run.blocks[0])
    return {
        "blocks": len(blocks),
        "request_sd": math.sqrt(st.mean(within)),
        "period_mean_sd_if_independent": math.sqrt(st.mean(within) / n),
        "block_sd_if_independent": math.sqrt(st.mean(within) / (2 * n)),
        "block_sd": st.stdev(blocks) if len(blocks) > 1 else None,
        "block_gains": [math.exp(b) for b in blocks],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="smollm-cpu")
    ap.add_argument("--blocks", type=int, default=8, help="blocks per schedule")
    ap.add_argument("--home", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    home = Home.resolve(args.home)
    dep = load_deployment(args.deployment, home)
    ws, _ = Workspace.init(home, dep)
    if "cand/aa-copy" not in ws.branches():
        wt = ws.add_worktree("aa-copy", "stock")
        gen = wt / "refspec" / "generate.py"
        gen.write_text(gen.read_text() + "\n# A/A copy: the same system under another tree hash.\n")
        ws.commit_worktree(wt, "A/A copy of stock")
    a = checkout(ws.repo_dir, "stock", ws.systems_cache)
    b = checkout(ws.repo_dir, "cand/aa-copy", ws.systems_cache)
    reqs, _ = draw_requests(dep, home)
    runs, secs = {"free": None, "lockstep": None}, {"free": 0.0, "lockstep": 0.0}
    with lease(home, slots_of(dep)) as slots:
        for i in range(2 * args.blocks):
            name = ["free", "lockstep"][i % 2]
            t = time.monotonic()
            runs[name] = paired_run(adapter_for(dep, home), a, b, slots, reqs, blocks=1,
                                    warmup=dep.controller.warmup_requests, raw=home.runs / f"schedule-{name}.jsonl",
                                    seed=i, run=runs[name], lockstep=name == "lockstep")  # fmt: skip
            secs[name] += time.monotonic() - t
            print(name, f"block {len(runs[name].blocks)}: {math.exp(st.mean(r.log_ratio() for r in runs[name].blocks[-1])):.4f}",
                  f"disturbed: {runs[name].block_disturbances[-1][:1]}", flush=True)  # fmt: skip
    out = {name: summarize(run) | {"s_per_block": secs[name] / len(run.blocks),
                                   "disturbed_blocks": sum(bool(d) for d in run.block_disturbances)}
           for name, run in runs.items()}  # fmt: skip
    out |= {
        "deployment": dep.name,
        "requests": len(reqs),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
