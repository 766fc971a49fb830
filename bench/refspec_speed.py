"""Output speed of refspec AR, refspec stock speculative, HF Transformers AR and HF prompt lookup.

    python bench/refspec_speed.py --device cpu:0 [--prompts 8] [--max-new-tokens 128]
    python bench/refspec_speed.py --device cuda:0

Same HumanEval prompts (smollm-cpu's workload with --prompts HumanEval samples, chat-templated), same slot, greedy,
exactly max-new-tokens new tokens each (EOS ignored by all four). A CPU slot pins this process to
one core with one torch thread. tokens/s = all new tokens / all wall time, prefill included;
"vs refspec AR" = geometric mean over prompts of (refspec AR time / the system's time on the same
prompt). Each system's output is compared token for token with refspec AR (agreement is reported,
not assumed).
Results go into docs/BENCHMARKS.md by hand, with the command, machine and date.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

SYSTEMS = ("refspec-ar", "refspec-spec", "hf-ar", "hf-pld")


def machine(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(int(device.split(":")[1]))
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores, {platform.machine()})"
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu:0")
    parser.add_argument("--prompts", type=int, default=8, help="HumanEval prompts (seeded sample)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--pld-tokens", type=int, default=10, help="HF prompt_lookup_num_tokens")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--requests", type=Path, default=None,
        help="a request file (JSONL) to use instead of building smollm-cpu's (no specpilot install needed)",
    )  # fmt: skip
    args = parser.parse_args()
    # refspec AR first: every other system's output is compared with it.
    systems = sorted(args.systems.split(","), key=lambda s: s != "refspec-ar")

    if args.requests is None:
        from specpilot.deployments import Home, load_deployment
        from specpilot.deployments.stock import import_refspec
        from specpilot.deployments.workloads import load_requests, request_file

        import_refspec()
        dep = load_deployment("smollm-cpu")
        workload = dep.workload.model_copy(update={"sets": {"humaneval": args.prompts}})
        dep = dep.model_copy(update={"workload": workload})
        lines = load_requests(request_file(dep, Home.resolve()))
        requests = [{"set": r.set, "input_ids": r.input_ids} for r in lines]
    else:  # a GPU machine without the project installed: the stock tree from this checkout
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deployments" / "stock" / "refspec"))
        requests = [json.loads(line) for line in args.requests.read_text().splitlines()]
    from refspec.config import load_config
    from refspec.runtime import open_engine, warm_up
    from refspec.weights import SMOLLM2, resolve_model

    config = load_config()
    engine = open_engine(args.device, SMOLLM2, None, config)  # pins a CPU slot first
    import torch
    from transformers import LlamaForCausalLM

    device = engine.device
    prompts = [r["input_ids"] for r in requests if r["set"] == "humaneval"][: args.prompts]
    n = args.max_new_tokens

    hf = LlamaForCausalLM.from_pretrained(resolve_model(SMOLLM2), dtype=engine.model.dtype).to(device).eval()
    hf.generation_config.eos_token_id = None  # exactly n new tokens, as refspec serves them
    hf.generation_config.pad_token_id = 0

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def run(system: str, prompt: list[int], tokens: int) -> tuple[list[int], int]:
        """(new tokens, target passes) of one greedy generation."""
        if system.startswith("refspec"):
            out = []
            for chunk in engine.generate(prompt, tokens, "ar" if system == "refspec-ar" else "spec"):
                out.extend(chunk)
            return out, engine.stats.steps
        ids = torch.tensor([prompt], device=device)
        extra = {"prompt_lookup_num_tokens": args.pld_tokens} if system == "hf-pld" else {}
        with torch.inference_mode():
            out = hf.generate(
                ids, max_new_tokens=tokens, do_sample=False, attention_mask=torch.ones_like(ids), **extra
            )
        return out[0, len(prompt) :].tolist(), 0

    warm_up(engine)
    for system in systems:
        run(system, prompts[0], 8)

    results = {s: {"seconds": 0.0, "tokens": 0, "steps": 0, "agree": 0, "per_prompt_s": []} for s in systems}
    reference: dict[int, list[int]] = {}
    for i, prompt in enumerate(prompts):
        for system in systems:  # interleaved, so a load change on the shared machine hits all alike
            sync()
            t = time.perf_counter()
            out, steps = run(system, prompt, n)
            sync()
            r = results[system]
            r["per_prompt_s"].append(time.perf_counter() - t)
            r["seconds"] += r["per_prompt_s"][-1]
            r["tokens"] += len(out)
            r["steps"] += steps
            if system == "refspec-ar":
                reference[i] = out
            r["agree"] += int(out == reference.get(i))
        print(
            f"prompt {i}: "
            + "  ".join(f"{s} {results[s]['tokens'] / results[s]['seconds']:.1f}" for s in systems)
        )

    print(
        f"\n{machine(args.device)}, slot {args.device}, dtype {str(engine.model.dtype).removeprefix('torch.')}, "
        f"{len(prompts)} HumanEval prompts x {n} new tokens, load average {os.getloadavg()[0]:.2f}"
    )
    # Per-prompt time ratios against refspec AR, run back to back, are robust to load drifting
    # over the run on a shared machine; their geometric mean is the speedup reported.
    base = results.get("refspec-ar", {}).get("per_prompt_s")
    print(f"{'system':<14}{'tok/s':>8}{'tau':>7}{'vs refspec AR':>15}{'same as refspec AR':>20}")
    for s, r in results.items():
        r["tok_s"] = r["tokens"] / r["seconds"]
        tau = f"{r['tokens'] / r['steps']:.2f}" if r["steps"] else "-"
        if base:
            logs = [math.log(b / t) for b, t in zip(base, r["per_prompt_s"], strict=True)]
            r["speedup_vs_refspec_ar"] = math.exp(sum(logs) / len(logs))
        ratio = f"{r['speedup_vs_refspec_ar']:.2f}x" if base else "-"
        print(f"{s:<14}{r['tok_s']:>8.1f}{tau:>7}{ratio:>15}{r['agree']:>14}/{len(prompts)}")
    if args.json:
        args.json.write_text(
            json.dumps({"device": args.device, "machine": machine(args.device), "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
