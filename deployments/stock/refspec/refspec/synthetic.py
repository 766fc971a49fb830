"""Synthetic targets: a Llama shape whose bf16 weights are drawn from a seed on the device that runs it.

A read-bound GPU target (the paper's 27B layer shapes) cannot be shipped to the lent machine, so
its folder holds only config.json (an HF Llama config plus a `synthetic` section) and a tokenizer;
the weights are made where the model is loaded. Every value comes from integer hashing and
correctly rounded fp32 arithmetic (no transcendental function, no device RNG), so a CPU and a GPU
draw the same bits: the fp32 scorer on the CPU sees the weights the bf16 server runs.

What the draw looks like: a matrix row is z · s_row, z ~ Irwin-Hall(4) standardised (mean 0, sd 1,
|z| ≤ 3.46), s_row = base · 2^e with e uniform over 64 steps of ±`row_spread`/2 binades (trained
checkpoints' rows differ in scale, so a per-row codec such as W12 sees a realistic exponent
spread), base = `gain` / sqrt(fan_in); norm gains uniform over 16 steps of 0.75-1.25. The result
is rounded to bf16 once.
"""

from __future__ import annotations

import math

import torch

from .errors import RefspecError

MARK = "synthetic"  # config.json key of a synthetic folder: {"seed", "gain", "row_spread"}
M32 = 0xFFFFFFFF
_ROW_LEVELS, _NORM_LEVELS = 64, 16
_CHUNK = 1 << 24  # elements drawn at once (int64 temporaries: ~8 bytes each, a few alive)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of x (int64 holding values in [0, 2^32)); exact on every device."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & M32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & M32
    return (x >> 16) ^ x


def _key(seed: int, name: str) -> int:
    """A tensor's 32-bit stream key: the seed and the tensor's name (not its place in any order)."""
    h = seed & M32
    for ch in name.encode():
        h = ((h ^ ch) * 0x01000193) & M32  # FNV-1a
    return h


def _normal(idx: torch.Tensor, key: int) -> torch.Tensor:
    """Standardised Irwin-Hall(4) fp32 values for element indices idx (int64, < 2^32)."""
    h0 = _mix((idx + key) & M32)
    h1 = _mix(h0 ^ 0x9E3779B9)
    s = (h0 & 0xFFFF) + (h0 >> 16) + (h1 & 0xFFFF) + (h1 >> 16)  # 4 uniforms of 16 bits, exact
    return (s.to(torch.float32) - 131070.0) * (math.sqrt(3.0) / 65536.0)


def _levels(n: int, lo: float, hi: float) -> list[float]:
    return [lo + (hi - lo) * k / (n - 1) for k in range(n)]


def draw_matrix(rows: int, cols: int, seed: int, name: str, gain: float, row_spread: float,
                device: torch.device, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:  # fmt: skip
    """The [rows, cols] matrix `name` of a synthetic target, drawn on `device`, rounded to bf16 once."""
    if rows * cols >= 1 << 32:
        raise RefspecError(f"synthetic tensor {name} of {rows} x {cols} exceeds 2^32 elements; split it")
    key = _key(seed, name)
    base = gain / math.sqrt(cols)
    table = torch.tensor([base * 2.0 ** e for e in _levels(_ROW_LEVELS, -row_spread / 2, row_spread / 2)],
                         dtype=torch.float32, device=device)  # fmt: skip
    r = torch.arange(rows, dtype=torch.int64, device=device)
    scale = table[_mix((r + _key(seed, name + ".rows")) & M32) % _ROW_LEVELS]
    out = torch.empty(rows, cols, dtype=dtype, device=device)
    step = max(1, _CHUNK // cols)
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        idx = torch.arange(r0 * cols, (r0 + n) * cols, dtype=torch.int64, device=device)
        z = _normal(idx, key).view(n, cols)
        out[r0 : r0 + n] = (z * scale[r0 : r0 + n, None]).to(torch.bfloat16).to(dtype)
    return out


def draw_gain(
    n: int, seed: int, name: str, device: torch.device, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """A norm's gain vector: uniform over 16 steps of 0.75-1.25, bf16."""
    table = torch.tensor(_levels(_NORM_LEVELS, 0.75, 1.25), dtype=torch.float32, device=device)
    idx = torch.arange(n, dtype=torch.int64, device=device)
    return table[_mix((idx + _key(seed, name)) & M32) % _NORM_LEVELS].to(torch.bfloat16).to(dtype)


def synthetic_state(
    config: dict, device: torch.device, dtype: torch.dtype = torch.bfloat16
) -> dict[str, torch.Tensor]:
    """Every tensor of an HF Llama folder's names for the shapes of `config`, drawn on `device`."""
    spec = config.get(MARK)
    if not isinstance(spec, dict) or type(spec.get("seed")) is not int:
        raise RefspecError(
            f"config.json's {MARK!r} section needs an integer 'seed'; rebuild the synthetic folder"
        )
    seed = spec["seed"]
    gain, spread = spec.get("gain", 1.0), spec.get("row_spread", 2.0)
    if (
        not all(type(x) in (int, float) and math.isfinite(x) for x in (gain, spread))
        or gain <= 0
        or spread < 0
    ):
        raise RefspecError(
            f"config.json's {MARK!r} section: gain {gain!r} must be a number > 0 and row_spread "
            f"{spread!r} a number >= 0; fix them or rebuild the synthetic folder"
        )
    h, inter, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv, d = config.get("num_key_value_heads", heads), config.get("head_dim") or h // heads

    def mat(name: str, rows: int, cols: int) -> torch.Tensor:
        return draw_matrix(rows, cols, seed, name, gain, spread, device, dtype)

    state = {"model.embed_tokens.weight": mat("model.embed_tokens.weight", v, h),
             "model.norm.weight": draw_gain(h, seed, "model.norm.weight", device, dtype)}  # fmt: skip
    if not config.get("tie_word_embeddings", False):
        state["lm_head.weight"] = mat("lm_head.weight", v, h)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for n, rows, cols in (("self_attn.q_proj", heads * d, h), ("self_attn.k_proj", kv * d, h),
                              ("self_attn.v_proj", kv * d, h), ("self_attn.o_proj", h, heads * d),
                              ("mlp.gate_proj", inter, h), ("mlp.up_proj", inter, h),
                              ("mlp.down_proj", h, inter)):  # fmt: skip
            state[f"{p}{n}.weight"] = mat(f"{p}{n}.weight", rows, cols)
        for n in ("input_layernorm", "post_attention_layernorm"):
            state[f"{p}{n}.weight"] = draw_gain(h, seed, f"{p}{n}.weight", device, dtype)
    return state
