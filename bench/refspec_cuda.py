"""refspec's CUDA path: ms per token of AR decoding and the cost of a verify pass by rows.

    python bench/refspec_cuda.py --model FOLDER [--requests FILE] [--prompts 12] [--tokens 128] --json OUT

Per prompt (a request file's first `--prompts`, else random token prompts of `--context` tokens):
refspec AR and stock chain spec decoding through the serve path's Engine (CUDA graphs), timed per
request on the host clock with the GPU synchronized (prefill included), and per decode step;
HF Transformers `generate` (greedy, same weights in bf16, EOS off) on the same prompts in the same
run. Then the verify pass alone by row count (graph replay and eager launches) at the prompts'
mean context. Speed only where `--model` holds random weights; with the real ones, τ too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deployments" / "stock" / "refspec"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=Path)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--rows", default="1,2,5,9,16,17,33,65")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument(
        "--repeats", type=int, default=1, help="serve the prompts this many times (per-request spread)"
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch
    from refspec.config import load_config
    from refspec.runtime import open_engine, warm_up

    t0 = time.perf_counter()
    engine = open_engine("cuda:0", args.model, None, load_config())
    load_s = time.perf_counter() - t0
    warm_s = warm_up(engine)
    model = engine.model
    if args.requests:
        prompts = [json.loads(x)["input_ids"] for x in args.requests.read_text().splitlines() if x.strip()][
            : args.prompts
        ]
    else:
        g = torch.Generator().manual_seed(0)
        prompts = [
            torch.randint(0, model.args.vocab, (args.context,), generator=g).tolist()
            for _ in range(args.prompts)
        ]

    def sync() -> None:
        torch.cuda.synchronize()

    out: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "load_s": load_s,
                 "warm_s": warm_s, "prompts": len(prompts), "tokens": args.tokens}  # fmt: skip
    outputs: dict[str, list[list[int]]] = {}
    for mode in ("ar", "spec"):
        per, steps, toks = [], 0, []
        for p in prompts * args.repeats:
            sync()
            t = time.perf_counter()
            chunks = list(engine.generate(p, args.tokens, mode))
            sync()
            per.append(time.perf_counter() - t)
            steps += engine.stats.steps
            toks.append([x for c in chunks for x in c])
        outputs[mode] = toks[: len(prompts)]
        n = len(per)
        out[mode] = {"ms_per_token": 1e3 * sum(per) / (n * args.tokens), "steps": steps,
                     "tau": n * args.tokens / steps, "per_request_s": per}  # fmt: skip
        if args.repeats > 1:  # each request's spread over its repeats (relative sd of its time)
            by = [per[i :: len(prompts)] for i in range(len(prompts))]
            out[mode]["request_rel_sd"] = [statistics.stdev(x) / statistics.mean(x) for x in by]
    out["spec_speedup_over_ar"] = out["ar"]["ms_per_token"] / out["spec"]["ms_per_token"]
    out["spec_equals_ar"] = sum(a == b for a, b in zip(outputs["ar"], outputs["spec"], strict=True))
    # Decode steps alone (no prefill): one-row passes at the first prompt's context.
    p = prompts[0]
    engine.start(p, args.tokens, drafting=False)
    sync()
    t = time.perf_counter()
    for _ in range(args.tokens - 1):
        engine.decode_step("ar", args.tokens)
    sync()
    out["ar_step_ms"] = 1e3 * (time.perf_counter() - t) / (args.tokens - 1)

    ctx = int(statistics.mean(len(p) for p in prompts)) + args.tokens // 2
    seq = (prompts[0] * 10)[: ctx + 70]
    model.prefill(seq[:ctx], 0)
    rows_out = {}
    for r in [int(x) for x in args.rows.split(",")]:
        res = {}
        for eager in (False, True):
            model.eager = eager
            model.verify(seq[ctx : ctx + r], list(range(ctx, ctx + r)), ctx, None)
            sync()
            n = 50 if not eager else 10
            t = time.perf_counter()
            for _ in range(n):
                model.verify(seq[ctx : ctx + r], list(range(ctx, ctx + r)), ctx, None)
            sync()
            res["eager_ms" if eager else "graph_ms"] = 1e3 * (time.perf_counter() - t) / n
        model.eager = False
        rows_out[r] = res
    out["verify_by_rows"] = {"context": ctx, "rows": rows_out}

    if not args.no_hf:
        from transformers import LlamaForCausalLM

        hf = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to("cuda").eval()
        hf.generation_config.eos_token_id = None
        hf.generation_config.pad_token_id = 0
        per = []
        for i, p in enumerate([prompts[0], *prompts]):
            ids = torch.tensor([p], device="cuda")
            sync()
            t = time.perf_counter()
            with torch.inference_mode():
                hf.generate(
                    ids, max_new_tokens=args.tokens, do_sample=False, attention_mask=torch.ones_like(ids)
                )
            sync()
            if i:  # the first is a warm-up
                per.append(time.perf_counter() - t)
        out["hf_ar_ms_per_token"] = 1e3 * sum(per) / (len(prompts) * args.tokens)
    print(json.dumps({k: v for k, v in out.items() if k not in ("ar", "spec")} | {
        "ar_ms_per_token": out["ar"]["ms_per_token"], "spec_ms_per_token": out["spec"]["ms_per_token"],
        "tau": out["spec"]["tau"]}, indent=1))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
