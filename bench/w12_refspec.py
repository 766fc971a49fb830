"""AR decode in refspec on CUDA with W12 weights against the same model in bf16.

    python bench/w12_refspec.py --device cuda:0 --requests REQUESTS.jsonl          # SmolLM2-135M
    python bench/w12_refspec.py --device cuda:0 --random-layers 4                  # Llama-3.1-8B shapes

Every projection (fused qkv, o, fused gate_up, down) is replaced by a W12Linear built from the
same bf16 weight and checked bit for bit on load; the LM head stays bf16 (as in the paper). Greedy
AR, exactly --max-new-tokens tokens per prompt, prefill included in the time. The random-weight
model has the real shapes of an 8B-class layer (weights N(0, 0.02)) and random prompts: for speed
only. Output agreement between the two runs is reported, not assumed (the GEMMs round differently).
Needs the refspec stock tree on sys.path (done below) and `specpilot.kernels.w12` importable.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "deployments" / "stock" / "refspec"))

LLAMA_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "max_position_embeddings": 8192, "tie_word_embeddings": False,
            "model_type": "llama", "hidden_act": "silu"}  # fmt: skip


def random_model(layers: int, device, dtype):
    import torch
    from refspec.model import ModelArgs, Transformer

    cfg = dict(LLAMA_8B, num_hidden_layers=layers)
    h, f, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    g = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02).to(dtype)

    state = {"model.embed_tokens.weight": rnd(cfg["vocab_size"], h), "lm_head.weight": rnd(cfg["vocab_size"], h),
             "model.norm.weight": torch.ones(h, device=device, dtype=dtype)}  # fmt: skip
    for i in range(layers):
        p = f"model.layers.{i}."
        state |= {p + "input_layernorm.weight": torch.ones(h, device=device, dtype=dtype),
                  p + "post_attention_layernorm.weight": torch.ones(h, device=device, dtype=dtype),
                  p + "self_attn.q_proj.weight": rnd(q, h), p + "self_attn.k_proj.weight": rnd(kv, h),
                  p + "self_attn.v_proj.weight": rnd(kv, h), p + "self_attn.o_proj.weight": rnd(h, q),
                  p + "mlp.gate_proj.weight": rnd(f, h), p + "mlp.up_proj.weight": rnd(f, h),
                  p + "mlp.down_proj.weight": rnd(h, f)}  # fmt: skip
    return Transformer(ModelArgs.from_hf(cfg), state, device, dtype)


def to_w12(model) -> float:
    """Swap every projection for W12 (checked bit for bit); bits per weight over the swapped ones."""
    from specpilot.kernels.w12 import W12Linear

    bits = weights = 0
    for i, (ln1, qkv, o, ln2, gu, down) in enumerate(model.layers):
        new = [W12Linear(lin.plain) for lin in (qkv, o, gu, down)]
        for lin in new:
            bits += 8 * sum(b.numel() * b.element_size() for b in lin.buffers())
            weights += lin.in_features * lin.out_features
        model.layers[i] = (ln1, new[0], new[1], ln2, new[2], new[3])
    return bits / weights


def graph_decoder(model, capacity: int):
    """AR decoding whose one-row step is a captured CUDA graph over a fixed-size, masked KV cache.

    Eager refspec on a GPU is bound by kernel launches at these sizes; a graph per weight format
    (captured on first use) shows what the weights themselves cost. Prefill runs eagerly.
    """
    import torch

    dev = model.device
    model.setup_cache(1, capacity)
    tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
    pos = torch.zeros(1, dtype=torch.long, device=dev)
    mask = torch.zeros(1, capacity, dtype=torch.bool, device=dev)
    graphs: dict[int, tuple] = {}

    def step_graph():
        key = id(model.layers[0][1])  # one graph per set of projection objects (bf16 or W12)
        if key not in graphs:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    model.forward(tok, pos, pos, mask, capacity)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = model.forward(tok, pos, pos, mask, capacity)[0, -1].argmax()
            graphs[key] = (g, out)
        return graphs[key]

    def decode(prompt: list[int], n: int) -> list[int]:
        g, out = step_graph()
        p = len(prompt)
        causal = torch.ones(p - 1, p - 1, dtype=torch.bool, device=dev).tril()
        ids = torch.tensor([prompt[:-1]], device=dev)
        model.forward(ids, torch.arange(p - 1, device=dev), 0, causal, p - 1, logits_rows=None)
        mask.zero_()
        mask[0, :p] = True
        tok.fill_(prompt[-1])
        pos.fill_(p - 1)
        outs = torch.empty(n, dtype=torch.long, device=dev)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(n):
            g.replay()
            outs[i] = out
            tok.copy_(out.view(1, 1))
            pos.add_(1)
            mask[0, p + i] = True
        torch.cuda.synchronize()
        decode.steps_s = time.perf_counter() - t  # the AR steps alone, without the eager prefill
        return outs.tolist()

    return decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--requests", type=Path, help="request file (JSONL with input_ids) for SmolLM2")
    ap.add_argument("--random-layers", type=int, default=0, help="Llama-3.1-8B-shaped random model")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--graph", action="store_true", help="replay each AR step as a CUDA graph (no launch overhead)"
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--tuned", type=Path, help="a bench/w12_gemm.py sweep JSON: its best configs join gemm.TUNED"
    )
    args = ap.parse_args()
    if args.tuned:
        from specpilot.kernels.w12 import GemmConfig, gemm

        for row in json.loads(args.tuned.read_text())["rows"]:
            gemm.TUNED.setdefault((row["N"], row["K"]), {})[row["M"]] = GemmConfig(**row["config"])

    import torch
    from refspec.config import Config, Decode
    from refspec.generate import Engine, greedy
    from refspec.model import load_model
    from refspec.weights import SMOLLM2, resolve_model

    device, dtype = torch.device(args.device), torch.bfloat16
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    config = Config(decode=Decode(mode="ar"))
    if args.random_layers:
        model = random_model(args.random_layers, device, dtype)
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(0, 128000, (200,), generator=g).tolist() for _ in range(args.prompts)]
        name = f"Llama-3.1-8B shapes, {args.random_layers} layers, random weights"
    else:
        model = load_model(resolve_model(SMOLLM2), device, dtype, "plain")
        lines = args.requests.read_text().splitlines()[: args.prompts]
        prompts = [json.loads(line)["input_ids"] for line in lines]
        name = "SmolLM2-135M-Instruct"
    engine = Engine(model, config)

    decode = graph_decoder(model, max(map(len, prompts)) + args.max_new_tokens + 8) if args.graph else None

    def timed(p: list[int]) -> tuple[float, list[int]]:
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = decode(p, args.max_new_tokens) if decode else greedy(engine, p, args.max_new_tokens, "ar")[0]
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t, out

    bf16_layers = list(model.layers)
    t0 = time.perf_counter()
    bpw = to_w12(model)
    encode_s = time.perf_counter() - t0
    w12_layers = list(model.layers)
    kinds = {"bf16": bf16_layers, "w12": w12_layers}
    for layers in kinds.values():  # warm-up: every kernel compiled, the KV cache at full size
        model.layers[:] = layers
        for p in prompts:
            timed(p)
    best = {k: [math.inf] * len(prompts) for k in kinds}
    steps = {k: [math.inf] * len(prompts) for k in kinds}
    outs: dict[str, list[list[int]]] = {k: [[] for _ in prompts] for k in kinds}
    for _ in range(args.repeats):  # interleaved per prompt, so drift hits both alike; best of repeats
        for i, p in enumerate(prompts):
            for k, layers in kinds.items():
                model.layers[:] = layers
                dt, outs[k][i] = timed(p)
                best[k][i] = min(best[k][i], dt)
                if decode:
                    steps[k][i] = min(steps[k][i], decode.steps_s)
    n = args.max_new_tokens * len(prompts)
    speedup = math.exp(
        sum(math.log(b / w) for b, w in zip(best["bf16"], best["w12"], strict=True)) / len(prompts)
    )
    res = {"model": name, "device": torch.cuda.get_device_name(device) if cuda else "cpu", "prompts": len(prompts),
           "new_tokens": args.max_new_tokens, "repeats": args.repeats, "bf16_tok_s": n / sum(best["bf16"]),
           "w12_tok_s": n / sum(best["w12"]), "speedup": speedup,
           "same_output": sum(a == b for a, b in zip(outs["bf16"], outs["w12"], strict=True)),
           "bits_per_weight": bpw, "encode_and_check_s": encode_s}  # fmt: skip
    if decode:  # the steps alone: prefill (eager, > 64 rows: W12 decodes each weight for cuBLAS) left out
        res |= {"bf16_step_tok_s": n / sum(steps["bf16"]), "w12_step_tok_s": n / sum(steps["w12"]),
                "step_speedup": sum(steps["bf16"]) / sum(steps["w12"])}  # fmt: skip
    print(json.dumps(res, indent=1))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
