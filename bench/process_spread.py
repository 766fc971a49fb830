"""How much a fresh refspec process's speed differs from the next one's, on one core, and whether
backing the weights with transparent huge pages takes that spread away.

    python bench/process_spread.py --processes 8 --requests 3 [--core 0] [--json OUT]

Each process (pinned to `--core`, one thread) loads SmolLM2-135M from the shared cache and serves
the same requests of the smollm-cpu workload by greedy speculative decoding; the arms alternate
process by process: `4k` (the allocator's default pages) and `thp` (THP_MEM_ALLOC_ENABLE=1:
PyTorch's CPU allocator aligns large allocations to 2 MiB and asks for huge pages). Reported per
arm: the spread of per-process mean log speed against the spread inside a process (what the paired
design's blocks inherit when each period starts fresh processes), and the huge pages the process
held (AnonHugePages of /proc/self/smaps_rollup).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics as st
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time, torch
torch.set_num_threads(1)
from specpilot.deployments import Home, load_deployment
from specpilot.deployments.workloads import load_requests, request_file
from refspec.config import load_config
from refspec.generate import Engine, greedy
from refspec.model import load_model
from refspec.weights import SMOLLM2, resolve_model
n = int(sys.argv[1])
reqs = load_requests(request_file(load_deployment("smollm-cpu"), Home.resolve(None)))[:n]
cfg = load_config()
eng = Engine(load_model(resolve_model(SMOLLM2), torch.device("cpu"), torch.float32, cfg.runtime.cpu_layout), cfg)
greedy(eng, reqs[0].input_ids, 16)  # warm-up
speeds = []
for r in reqs:
    t = time.perf_counter()
    out, _ = greedy(eng, r.input_ids, r.max_new_tokens)
    speeds.append(len(out) / (time.perf_counter() - t))
huge = next((int(l.split()[1]) for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages")), 0)
print(json.dumps({"speeds": speeds, "anon_huge_kib": huge}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=8, help="processes per arm")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--core", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from specpilot.deployments.stock import stock_tree_path

    tree = str(stock_tree_path("refspec"))
    arms: dict[str, list[dict]] = {"4k": [], "thp": []}
    for i in range(2 * args.processes):
        arm = ["4k", "thp"][i % 2]
        env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("THP_MEM_ALLOC_ENABLE", None)
        if arm == "thp":
            env["THP_MEM_ALLOC_ENABLE"] = "1"
        cmd = ["taskset", "-c", str(args.core), sys.executable, "-c", CHILD, str(args.requests)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        arms[arm].append(json.loads(out.strip().splitlines()[-1]))
        print(arm, arms[arm][-1], flush=True)
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "core": args.core}
    for arm, procs in arms.items():
        logs = [[math.log(s) for s in p["speeds"]] for p in procs]
        req_means = [st.mean(col) for col in zip(*logs, strict=True)]
        resid = [[x - m for x, m in zip(row, req_means, strict=True)] for row in logs]
        within = st.mean(st.variance(r) for r in resid) if args.requests > 1 else 0.0
        result[arm] = {
            "process_mean_sd": st.stdev(st.mean(r) for r in resid),
            "within_process_sd": math.sqrt(within),
            "mean_tokens_per_s": math.exp(st.mean(x for row in logs for x in row)),
            "anon_huge_kib": [p["anon_huge_kib"] for p in procs],
            "speeds": [p["speeds"] for p in procs],
        }
    print(json.dumps({k: v for k, v in result.items()}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
