"""Where the swapped design's A/A noise comes from, and which schedule of a block removes it.

    python bench/swapped_schedule.py --deployment smollm-cpu --blocks 8 [--arms free,lockstep]
        [--home DIR] [--json OUT]

Stock against a copy of stock (another tree hash, the same system), blocks alternating between
schedules (arms) of a swapped block: `free` (shipped: in each of the two periods each system
serves the whole request stream at its own pace), `lockstep` (both start every request together
and the next waits for both), `split2` (the requests cut in two parts, each served in a swapped
pair of periods of its own: four periods, twice the processes, each living half as long). Per
arm: the block sd (what the verdict's σ is made of), the spread of the per-request log speed ratio
in a block against what independent requests would give, seconds per block.
(`bench/noise_residuals.py` splits the raw files' noise further.)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics as st
import time
from pathlib import Path

from controller_aa import aa_copy  # bench/ is this script's folder

from specpilot.controller.adapters import adapter_for
from specpilot.controller.context import draw_requests, slots_of
from specpilot.controller.paired import paired_run
from specpilot.controller.slots import lease
from specpilot.controller.systems import checkout
from specpilot.deployments import Home, load_deployment
from specpilot.memory_store.workspace import Workspace

# A period's schedule: free-running, lock-step, or the requests cut into two swapped pairs of periods.
ARMS = {"free": {}, "lockstep": {"lockstep": True}, "split2": {"splits": 2}}


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
    ap.add_argument("--arms", default="free,lockstep", help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--home", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    home = Home.resolve(args.home)
    dep = load_deployment(args.deployment, home)
    ws, _ = Workspace.init(home, dep)
    a = checkout(ws.repo_dir, "stock", ws.systems_cache)
    b = checkout(ws.repo_dir, aa_copy(ws), ws.systems_cache)
    reqs, _ = draw_requests(dep, home)
    arms = args.arms.split(",")
    runs, secs = dict.fromkeys(arms), dict.fromkeys(arms, 0.0)
    with lease(home, slots_of(dep)) as slots:
        for i in range(len(arms) * args.blocks):
            name = arms[i % len(arms)]
            t = time.monotonic()
            runs[name] = paired_run(adapter_for(dep, home), a, b, slots, reqs, blocks=1,
                                    warmup=dep.controller.warmup_requests, raw=home.runs / f"schedule-{name}.jsonl",
                                    seed=i, run=runs[name], **ARMS[name])  # fmt: skip
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
