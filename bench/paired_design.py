"""A/A noise of the paired designs on CPU slots: sliced against swapped, blocks alternating.

    python bench/paired_design.py --deployment smollm-cpu --rounds 8 [--designs sliced,swapped]
        [--home DIR] [--json OUT]

Stock against a copy of stock (another tree hash, the same system). `sliced`: on both cores A and
B at once, taking ~50 ms turns (slicer.py), the requests dealt across the cores (a round is a
block per core); `swapped`: a round is one block of two periods, A and B concurrently on the two
cores, then swapped. Per design: the block sd (what the
verdict's σ is made of), the per-request log-ratio sd against what independent requests would
give a block, seconds per block. The designs alternate block by block, so both see the same hour
of the host. (This replaced bench/swapped_schedule.py, whose lock-step and split schedules of the
swapped design were measured no better, docs/BENCHMARKS.md, and were removed.)
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
from specpilot.controller.context import draw_requests
from specpilot.controller.paired import paired_run
from specpilot.controller.slots import Slot, lease
from specpilot.controller.systems import checkout
from specpilot.deployments import Home, load_deployment
from specpilot.memory_store.workspace import Workspace


def summarize(run) -> dict:
    blocks = [st.mean(r.log_ratio() for r in blk) for blk in run.blocks]
    within = [st.variance([r.log_ratio() for r in blk]) for blk in run.blocks]
    n = len(run.blocks[0])
    return {
        "blocks": len(blocks),
        "request_sd": math.sqrt(st.mean(within)),
        "block_sd_if_independent": math.sqrt(st.mean(within) / n),
        "block_sd": st.stdev(blocks) if len(blocks) > 1 else None,
        "block_gains": [math.exp(b) for b in blocks],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="smollm-cpu")
    ap.add_argument("--rounds", type=int, default=8, help="rounds per design")
    ap.add_argument("--designs", default="sliced,swapped")
    ap.add_argument("--home", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    home = Home.resolve(args.home)
    dep = load_deployment(args.deployment, home)
    ws, _ = Workspace.init(home, dep)
    a = checkout(ws.repo_dir, "stock", ws.systems_cache)
    b = checkout(ws.repo_dir, aa_copy(ws), ws.systems_cache)
    reqs, _ = draw_requests(dep, home)
    designs = args.designs.split(",")
    runs, secs = dict.fromkeys(designs), dict.fromkeys(designs, 0.0)
    slots = [Slot.parse(s) for s in dep.devices.slots]
    with lease(home, slots):
        for i in range(len(designs) * args.rounds):
            name = designs[i % len(designs)]
            t = time.monotonic()
            runs[name] = paired_run(adapter_for(dep, home), a, b, slots, reqs, rounds=1, design=name,
                                    warmup=dep.controller.warmup_requests, raw=home.runs / f"design-{name}.jsonl",
                                    seed=i, run=runs[name])  # fmt: skip
            secs[name] += time.monotonic() - t
            gain = math.exp(st.mean(r.log_ratio() for r in runs[name].blocks[-1]))
            print(name, f"blocks {len(runs[name].blocks)}: last {gain:.4f} ({time.monotonic() - t:.0f} s)",
                  f"disturbed: {runs[name].block_disturbances[-1][:1]}", flush=True)  # fmt: skip
    out = {name: summarize(run) | {"s_per_block": secs[name] / len(run.blocks), "s_per_round": secs[name] / args.rounds,
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
