"""W12 as a drop-in for HF Transformers' AR decode (issue 41, item 3): Llama-3.1-8B's shapes, random
weights, greedy decode with one step captured in a CUDA graph on both sides.

    python3 bench/hf_w12.py [--layers 32] [--tokens 128] [--rounds 3] --json OUT   # on the device

Two LlamaForCausalLM with the same bf16 weights (drawn on the GPU from one seed, HF's own init);
one gets `specpilot.kernels.w12.convert_model` (every nn.Linear but the LM head becomes a W12Linear,
each checked bit for bit on load). Each model decodes with a StaticCache: the prompt is prefilled
eagerly, then one decode step (forward of one token at the cache position held in a device tensor,
argmax into a device tensor) is captured as a CUDA graph and replayed once a token, nothing read
back in between. Timed: the replays of `--tokens` tokens (CUDA events), the two models in turns
(A B A B ...), median per token. The W12 GEMM's sums are in another order than cuBLAS's, so the
tokens can part at a near-tie: the agreement is reported, not assumed. `read_floor_ms` counts the
bytes a step reads (weights; the cache is small at these lengths) over the device's peak.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

PEAK = {"H200": 4.8e12, "H100": 3.35e12}
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0,
                max_position_embeddings=8192, tie_word_embeddings=False)  # fmt: skip


def build(layers: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**LLAMA_8B, num_hidden_layers=layers, torch_dtype="bfloat16")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    model.generation_config.eos_token_id = None
    return cfg, model


def static_cache(cfg, length: int):
    from transformers import StaticCache

    try:
        return StaticCache(
            config=cfg, max_batch_size=1, max_cache_len=length, device="cuda", dtype=torch.bfloat16
        )
    except TypeError:  # newer transformers: no batch, device or dtype arguments (taken from the first update)
        return StaticCache(config=cfg, max_cache_len=length)


class GraphDecoder:
    """Greedy decode of one model: eager prefill, then a captured one-token step replayed per token."""

    def __init__(self, cfg, model, prompt: list[int], tokens: int):
        self.model, self.prompt, self.tokens = model, prompt, tokens
        self.cache = static_cache(cfg, len(prompt) + tokens + 8)
        self.ids = torch.zeros(1, 1, dtype=torch.long, device="cuda")
        self.pos = torch.zeros(1, dtype=torch.long, device="cuda")
        self.graph = None

    def _step(self):
        out = self.model(input_ids=self.ids, position_ids=self.pos[None], cache_position=self.pos,
                         past_key_values=self.cache, use_cache=True)  # fmt: skip
        self.ids.copy_(out.logits[:, -1].argmax(-1, keepdim=True))
        self.pos += 1

    def _prefill(self):
        self.cache.reset()
        p = torch.tensor([self.prompt], device="cuda")
        out = self.model(input_ids=p, cache_position=torch.arange(p.shape[1], device="cuda"),
                         past_key_values=self.cache, use_cache=True)  # fmt: skip
        self.ids.copy_(out.logits[:, -1].argmax(-1, keepdim=True))
        self.pos.fill_(p.shape[1])

    @torch.inference_mode()
    def run(self) -> tuple[list[int], float]:
        """(the tokens, ms per decode step); the first call captures the step's graph."""
        self._prefill()
        if self.graph is None:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    self._step()
            torch.cuda.current_stream().wait_stream(s)
            self._prefill()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._step()
            self._prefill()
        out = torch.empty(self.tokens, dtype=torch.long, device="cuda")
        out[0] = self.ids[0, 0]
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for i in range(1, self.tokens):
            self.graph.replay()
            out[i] = self.ids[0, 0]
        t1.record()
        torch.cuda.synchronize()
        return out.tolist(), t0.elapsed_time(t1) / (self.tokens - 1)

    @torch.inference_mode()
    def eager(self) -> list[int]:
        """The same decode without the graph (the graph's tokens must be these)."""
        self._prefill()
        out = [int(self.ids[0, 0])]
        for _ in range(1, self.tokens):
            self._step()
            out.append(int(self.ids[0, 0]))
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import transformers

    from specpilot.kernels.w12 import convert_model

    cfg, bf16 = build(args.layers, 0)
    _, w12 = build(args.layers, 0)
    same_weights = all(
        torch.equal(a, b) for a, b in zip(bf16.state_dict().values(), w12.state_dict().values(), strict=True)
    )
    t = time.perf_counter()
    stats = convert_model(w12)  # every Linear but lm_head; each weight checked bit for bit
    convert_s = time.perf_counter() - t
    torch.cuda.empty_cache()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (args.prompt,), generator=g).tolist()
    dec = {
        "bf16": GraphDecoder(cfg, bf16, prompt, args.tokens),
        "w12": GraphDecoder(cfg, w12, prompt, args.tokens),
    }
    graph_equals_eager = {k: d.run()[0] == d.eager() for k, d in dec.items()}
    ms = {k: [] for k in dec}
    toks = {}
    for _ in range(args.rounds):
        for k, d in dec.items():
            toks[k], m = d.run()
            ms[k].append(m)
    weights = lambda m: sum(p.numel() * p.element_size() for p in [*m.parameters(), *m.buffers()])  # noqa: E731
    embed = bf16.model.embed_tokens.weight.numel() * 2  # read by index, one row a step
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK.items() if k in name), None)
    med = {k: statistics.median(v) for k, v in ms.items()}
    agree = next(
        (i for i, (a, b) in enumerate(zip(toks["bf16"], toks["w12"], strict=True)) if a != b),
        len(toks["bf16"]),
    )
    bits = [s["bits_per_weight"] for s in stats.values() if "bits_per_weight" in s]
    out = {
        "device": name, "torch": torch.__version__, "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": f"Llama-3.1-8B shapes, {args.layers} layers, random weights (HF init, seed 0)",
        "prompt": args.prompt, "tokens": args.tokens, "rounds": args.rounds, "same_weights": same_weights,
        "convert_s": convert_s, "bits_per_weight_mean": statistics.mean(bits) if bits else None,
        "bf16_ms_per_token": med["bf16"], "w12_ms_per_token": med["w12"], "hf_w12_speedup": med["bf16"] / med["w12"],
        "runs_ms": ms, "graph_equals_eager": graph_equals_eager, "tokens_equal_until": agree,
        "bf16_bytes": weights(bf16) - embed, "w12_bytes": weights(w12) - embed,
        "bf16_read_floor_ms": (weights(bf16) - embed) / peak * 1e3 if peak else None,
        "w12_read_floor_ms": (weights(w12) - embed) / peak * 1e3 if peak else None,
    }  # fmt: skip
    print(json.dumps(out, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
