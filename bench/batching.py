"""Stock speculative decoding over AR by batch size: refspec's batch serving (refspec/batch.py).

    python bench/batching.py --device cpu:0 --batches 1,2,4,8 [--prompts 16] [--max-new-tokens 64]
    python bench/batching.py --device cuda:0 --batches 1,8,16,32 --requests REQ.jsonl   # a GPU machine

The same HumanEval prompts (smollm-cpu's workload, chat-templated) served B at a time by one
`BatchEngine` (a lane frees, the next prompt takes it), greedy, exactly max-new-tokens each (EOS
ignored). Output throughput = all new tokens / wall time of the whole set (prefills included);
spec and AR alternate per repeat so a drift of the machine's speed hits both. Every request's
output at every batch size is compared token for token with its single-request AR output
(`Engine`, batch 1): agreement is reported, not assumed. On CUDA the eager Transformer runs
(the CUDA-graph path serves one request). Results go into docs/BENCHMARKS.md by hand, with the
command, machine and date; --json also writes them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path


def requests_for(args) -> list[dict]:
    if args.requests is not None:
        return [json.loads(line) for line in args.requests.read_text().splitlines() if line.strip()]
    from specpilot.deployments import Home, load_deployment
    from specpilot.deployments.workloads import load_requests, request_file

    dep = load_deployment("smollm-cpu")
    dep = dep.model_copy(
        update={"workload": dep.workload.model_copy(update={"sets": {"humaneval": args.prompts}})}
    )
    return [
        {"set": r.set, "input_ids": r.input_ids} for r in load_requests(request_file(dep, Home.resolve()))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu:0")
    parser.add_argument("--batches", default="1,2,4,8", help="batch sizes (lanes), comma-separated")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="spec/AR pairs per batch size")
    parser.add_argument(
        "--requests", type=Path, default=None, help="a request file (JSONL) instead of smollm-cpu's"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deployments" / "stock" / "refspec"))
    reqs = requests_for(args)
    from refspec.batch import BatchEngine
    from refspec.config import load_config
    from refspec.runtime import Request, open_engine, warm_up
    from refspec.weights import SMOLLM2

    t0 = time.perf_counter()
    engine = open_engine(args.device, SMOLLM2, None, load_config(), eager=True)  # pins a CPU slot first
    import torch

    print(f"engine on {engine.device} ({engine.model.dtype}) in {time.perf_counter() - t0:.1f} s", flush=True)

    prompts = [r["input_ids"] for r in reqs if r.get("set", "humaneval") == "humaneval"][: args.prompts]
    n = args.max_new_tokens
    warm_up(engine)
    reference, t_ref = [], time.perf_counter()
    for p in prompts:  # single-request AR: what every batched output must equal
        out = []
        for chunk in engine.generate(p, n, "ar"):
            out.extend(chunk)
        reference.append(out)
    print(
        f"single-request AR reference: {len(prompts)} prompts in {time.perf_counter() - t_ref:.1f} s",
        flush=True,
    )

    def sync() -> None:
        if engine.device.type == "cuda":
            torch.cuda.synchronize(engine.device)

    results = {}
    for b in [int(x) for x in args.batches.split(",")]:
        batch = BatchEngine(engine, b)
        list(batch.generate([Request(id=0, input_ids=prompts[0], max_new_tokens=8)], "spec"))  # warm
        row = {"spec_s": [], "ar_s": [], "steps": {}, "agree": {}}
        for _ in range(args.repeats):
            for mode in ("spec", "ar"):
                outs: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
                sync()
                t = time.perf_counter()
                for ev in batch.generate(
                    [Request(id=i, input_ids=p, max_new_tokens=n) for i, p in enumerate(prompts)], mode
                ):
                    if "tokens" in ev:
                        outs[ev["id"]].extend(ev["tokens"])
                sync()
                row[f"{mode}_s"].append(time.perf_counter() - t)
                row["steps"][mode] = batch.steps
                row["agree"][mode] = sum(outs[i] == reference[i] for i in outs)
        tokens = n * len(prompts)
        spec_tps = tokens / min(row["spec_s"])
        ar_tps = tokens / min(row["ar_s"])
        ratio = math.exp(
            sum(math.log(a / s) for s, a in zip(row["spec_s"], row["ar_s"], strict=True)) / args.repeats
        )
        results[b] = {**row, "spec_tokens_per_s": spec_tps, "ar_tokens_per_s": ar_tps, "spec_over_ar": ratio}
        print(f"batch {b:>3}: spec {spec_tps:8.1f} tok/s  AR {ar_tps:8.1f} tok/s  spec/AR {ratio:.3f}  "
              f"steps spec {row['steps']['spec']} AR {row['steps']['ar']}  "
              f"same as single AR: spec {row['agree']['spec']}/{len(prompts)} AR {row['agree']['ar']}/{len(prompts)}",
              flush=True)  # fmt: skip
        if args.json:  # after every batch size, so a run cut short keeps what it measured
            args.json.write_text(json.dumps(summary(args, engine, prompts, n, results), indent=1))


def summary(args, engine, prompts, n, results) -> dict:
    import torch

    dev = (
        torch.cuda.get_device_name(engine.device)
        if engine.device.type == "cuda"
        else f"CPU core ({os.cpu_count()} cores)"
    )
    return {
        "command": "python bench/batching.py " + " ".join(sys.argv[1:]),
        "device": dev,
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "prompts": len(prompts),
        "max_new_tokens": n,
        "by_batch": results,
    }


if __name__ == "__main__":
    main()
