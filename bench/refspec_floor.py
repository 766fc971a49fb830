"""refspec's CUDA step near its floor (issue 40): ms per token and a per-step breakdown, AR and spec.

    python bench/refspec_floor.py --model FOLDER --requests FILE [--prompts 12] [--tokens 128] --json OUT
    python bench/refspec_floor.py --random [--context 300] --json OUT     # SmolLM2's shapes, random weights
    python bench/refspec_floor.py --deployment smollm-h200 --json OUT     # its weights and requests (SpecPilot)

Per mode (AR, stock chain spec) through the serve path's Engine: ms per token per request on the host
clock, GPU synchronized, prefill included (the figure bench/refspec_cuda.py reports), and each
decode step's breakdown (refspec.profile.step_breakdown): kernels per step (torch.profiler), device
µs per step (CUDA events around the pass's graph) and host µs per step (the step's wall time minus
its device time: the part of the step the GPU waits on the host). Then the pass by rows (persistent
graph, and the per-phase kernels in a graph: the path before issue 40), and HF `generate` (greedy,
bf16, EOS off) on the same prompts in the same run unless --no-hf, --random or a synthetic target.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "deployments" / "stock" / "refspec"))


def random_engine(context: int, prompts: int, seed: int = 0):
    import torch
    from refspec.config import load_config
    from refspec.cuda_graphs import CudaModel
    from refspec.generate import Engine
    from refspec.model import ModelArgs

    a = ModelArgs(vocab=49152, hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, head_dim=64,
                  rms_eps=1e-5, rope_theta=100000.0, max_positions=8192, tied=True)  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    shapes = {"model.embed_tokens.weight": (a.vocab, a.hidden), "model.norm.weight": (a.hidden,)}
    for i in range(a.layers):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (a.hidden,), p + "post_attention_layernorm.weight": (a.hidden,),
                   p + "self_attn.q_proj.weight": (a.heads * a.head_dim, a.hidden),
                   p + "self_attn.k_proj.weight": (a.kv_heads * a.head_dim, a.hidden),
                   p + "self_attn.v_proj.weight": (a.kv_heads * a.head_dim, a.hidden),
                   p + "self_attn.o_proj.weight": (a.hidden, a.heads * a.head_dim),
                   p + "mlp.gate_proj.weight": (a.intermediate, a.hidden),
                   p + "mlp.up_proj.weight": (a.intermediate, a.hidden),
                   p + "mlp.down_proj.weight": (a.hidden, a.intermediate)}  # fmt: skip
    st = {k: torch.randn(s, generator=g) * (0.5 if "embed" in k else 1 / s[-1] ** 0.5) if len(s) > 1
          else 1 + 0.1 * torch.randn(s, generator=g) for k, s in shapes.items()}  # fmt: skip
    engine = Engine(CudaModel(a, st, torch.device("cuda"), 4096), load_config())
    base = [torch.randint(0, a.vocab, (40,), generator=g).tolist() for _ in range(prompts)]
    # Repeats, so the n-gram drafter proposes (random weights accept little: speed only).
    return engine, [(b * (context // 40 + 1))[:context] for b in base]


def pass_by_rows(model, seq: list[int], ctx: int, rows: list[int]) -> dict:
    """ms per pass by rows at context ctx: the persistent graph, and the per-phase kernels in a graph."""
    import torch

    model.prefill(seq[:ctx], 0)
    out = {}
    for r in rows:
        args = (seq[ctx : ctx + r], list(range(ctx, ctx + r)), ctx, None)
        res = {}
        model.verify(*args)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(100):
            model.verify(*args)
        torch.cuda.synchronize()
        res["persistent_ms"] = 1e3 * (time.perf_counter() - t) / 100
        # The path before issue 40: the per-phase kernels captured in one graph (device time only).
        n = -(-r // 16) * 16
        model.eager = True
        try:
            res["per_phase_graph_device_ms"] = (
                graph_us(lambda n=n: model._pass(n, False), per=50, warm=1)[0] / 1e3
            )
        finally:
            model.eager = False
        model.timing = []
        for _ in range(50):
            model.verify(*args)
        torch.cuda.synchronize()
        res["persistent_device_ms"] = sum(a.elapsed_time(b) for a, b in model.timing) / 50
        model.timing = None
        out[r] = res
    return out


SWEEP = [("base", {}, 0), ("barriers only", {}, 127), ("no qkv", {}, 1), ("no attention", {}, 2),
         ("no o_proj", {}, 4), ("no gate_up", {}, 8), ("no down", {}, 16), ("no head", {}, 32),
         ("no prefetch", {}, 64), ("stages 3", {"num_stages": 3}, 0), ("one program per head", {"ASPL": 0}, 0),
         ("GBN 32", {"GBN": 32}, 0), ("QBK 128", {"QBK": 128}, 0), ("HBK 128", {"HBK": 128}, 0),
         ("DBK 64", {"DBK": 64}, 0), ("split 128/64", {"ASPL": 128}, 0)]  # fmt: skip


def graph_us(body, runs: int = 1, per: int = 200, warm: int = 20) -> list[float]:
    """`body` (run once eagerly: Triton compiles there) captured as one CUDA graph, `warm` replays,
    then device µs per replay of each of `runs` runs of `per` replays (CUDA events)."""
    import torch

    body()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    for _ in range(warm):
        g.replay()
    out = []
    for _ in range(runs):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(per):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        out.append(1e3 * e0.elapsed_time(e1) / per)
    return out


def sweep(model, seq: list[int], ctx: int) -> list:
    """One-row pass device µs per persistent-kernel variant (phases left out, tiles, stages)."""
    from refspec import cuda_persist
    from refspec.cuda_graphs import PERSIST

    model.prefill(seq[:ctx], 0)
    model.verify(seq[ctx : ctx + 1], [ctx], ctx, None)  # the inputs of a one-row pass, on the device
    rows = []
    for name, over, skip in SWEEP:
        cfg = PERSIST | over

        def body(cfg=cfg, skip=skip) -> None:
            model.bar.zero_()
            cuda_persist.launch(model, 16, True, cfg, skip)

        try:
            rows.append((name, round(graph_us(body)[0], 1)))
        except Exception as e:  # a variant that does not compile or fit
            rows.append((name, f"{type(e).__name__}: {str(e)[:120]}"))
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--requests", type=Path)
    ap.add_argument("--deployment")
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--rows", default="1,9,16,17,33")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument(
        "--sweep", action="store_true", help="only time persistent-kernel variants (random weights)"
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch
    from refspec.config import load_config
    from refspec.profile import step_breakdown
    from refspec.runtime import open_engine, warm_up

    if args.deployment:  # SpecPilot's weights folder and request file of the deployment
        from specpilot.controller.refspec_system import weights_folder
        from specpilot.deployments import Home, load_deployment
        from specpilot.deployments.workloads import request_file

        home = Home.resolve()
        dep = load_deployment(args.deployment, home)
        args.model, args.requests = str(weights_folder(dep, home)), request_file(dep, home)
        args.tokens = dep.workload.max_new_tokens
    t0 = time.perf_counter()
    if args.random:
        engine, prompts = random_engine(args.context, args.prompts)
    else:
        engine = open_engine("cuda:0", args.model, None, load_config())
        lines = args.requests.read_text().splitlines()
        prompts = [json.loads(x)["input_ids"] for x in lines if x.strip()][: args.prompts]
    load_s = time.perf_counter() - t0
    if args.sweep:
        seq = (prompts[0] * 20)[: args.context + 8]
        res = sweep(engine.model, seq, args.context)
        if args.json:
            args.json.write_text(json.dumps(res, indent=1) + "\n")
        return
    warm_s = warm_up(engine)
    model = engine.model
    out: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "weights": "random" if args.random else "real",
                 "load_s": load_s, "warm_s": warm_s, "prompts": len(prompts), "tokens": args.tokens,
                 "persistent_programs": model.nprog}  # fmt: skip
    outputs = {}
    for mode in ("ar", "spec"):
        per, steps, toks = [], 0, []
        for p in prompts:
            torch.cuda.synchronize()
            t = time.perf_counter()
            chunks = list(engine.generate(p, args.tokens, mode))
            torch.cuda.synchronize()
            per.append(time.perf_counter() - t)
            steps += engine.stats.steps
            toks.append([x for c in chunks for x in c])
        outputs[mode] = toks
        out[mode] = {"ms_per_token": 1e3 * sum(per) / (len(per) * args.tokens), "steps": steps,
                     "tau": len(per) * args.tokens / steps, "per_request_s": per,
                     "breakdown": step_breakdown(engine, prompts[:4], args.tokens, mode)}  # fmt: skip
    out["ar_ms_per_token"] = out["ar"]["ms_per_token"]
    out["spec_ms_per_token"] = out["spec"]["ms_per_token"]
    out["spec_speedup_over_ar"] = out["ar_ms_per_token"] / out["spec_ms_per_token"]
    out["spec_equals_ar"] = sum(a == b for a, b in zip(outputs["ar"], outputs["spec"], strict=True))
    out["spec_equals_ar_of"] = len(prompts)
    for key in ("kernels_per_step", "device_us_per_step", "host_us_per_step", "host_share"):
        out[key] = {m: out[m]["breakdown"][key] for m in ("ar", "spec")}
    ctx = sum(len(p) for p in prompts) // len(prompts) + args.tokens // 2
    seq = (prompts[0] * (ctx // len(prompts[0]) + 2))[: ctx + 70]
    out["pass_by_rows"] = {
        "context": ctx,
        "rows": pass_by_rows(model, seq, ctx, [int(x) for x in args.rows.split(",")]),
    }
    synthetic = args.model and "synthetic" in json.loads((Path(args.model) / "config.json").read_text())
    if synthetic:  # weights drawn at load (refspec/synthetic.py): no folder HF could read
        out["hf_ar_ms_per_token"] = None
    elif not (args.no_hf or args.random):
        from transformers import LlamaForCausalLM

        hf = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to("cuda").eval()
        hf.generation_config.eos_token_id = None
        hf.generation_config.pad_token_id = 0
        per = []
        for i, p in enumerate([prompts[0], *prompts]):
            ids = torch.tensor([p], device="cuda")
            torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.inference_mode():
                hf.generate(
                    ids, max_new_tokens=args.tokens, do_sample=False, attention_mask=torch.ones_like(ids)
                )
            torch.cuda.synchronize()
            if i:  # the first is a warm-up
                per.append(time.perf_counter() - t)
        out["hf_ar_ms_per_token"] = 1e3 * sum(per) / (len(prompts) * args.tokens)
    brief = {k: v for k, v in out.items() if k not in ("ar", "spec")}
    print(json.dumps(brief, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
