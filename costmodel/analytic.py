"""Analytic bytes and FLOPs of one decode step per kernel class, and their byte floors.

Byte floor of a class = max(FLOPs / (0.6 × peak FLOP/s), bytes / (0.9 × peak bandwidth)) (paper
§3.2). The counts are what an ideal kernel must move and compute for one verify step of N rows
per request over B requests at mean context length L:

- linear: every projection weight once (shared by all rows), the rows' activations in and out;
  2 FLOPs per weight per row. Attention layers: q, k, v, o. Gated DeltaNet layers (Qwen3-Next
  layout): q and k over the key heads, v and the output gate z over the value heads, the a/b gates
  (one per value head), and the output projection. Every layer: gate, up and down.
- attention: each request's KV cache read once per attention layer (a sliding window caps L),
  the N new K/V rows written, q in and the output out; QKᵀ and PV cost 4 × q_dim FLOPs per row per
  key. Applying the window to every attention layer undercounts, which is the safe side for a floor.
- recurrent: Gated DeltaNet state (value heads × d_k × d_v, fp32) read and written once per node,
  as stock verification does (one state update, and snapshot, per verified row); about 8 × d_k ×
  d_v FLOPs per head per node. A kernel that recomputes paths instead of snapshotting moves less
  and can beat this floor (paper §4.2).
- lm_head: the vocab × hidden weight once, the logits written and read back by the argmax (fp32).
- drafter: a model drafter's weights once per draft pass (a parallel drafter: one pass over its m
  positions; EAGLE-3: one pass per position), 2 FLOPs per weight per drafted row; the n-gram
  drafter reads its context once (int32 tokens).
- other: embedding rows, RMSNorms, residual adds and rotary embeddings (activations in and out).

Activations and KV are bf16 (fp32 for an fp32 target); fp8 targets keep bf16 activations and a
bf16 drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.deployments import Arch

from .devices import BYTE_EFFICIENCY, FLOP_EFFICIENCY, DeviceSpec

CLASSES = ("linear", "attention", "recurrent", "lm_head", "drafter", "other")
WEIGHT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
STATE_BYTES = 4  # Gated DeltaNet recurrent state is kept in fp32
LOGIT_BYTES = 4


@dataclass(frozen=True)
class StepShape:
    """One verify step: N rows per request (draft nodes + the root), B requests, mean context L."""

    rows: float
    batch: int = 1
    context: float = 0.0


@dataclass(frozen=True)
class DrafterShape:
    kind: str  # ngram | dflash2 | dspark | eagle3
    params: int = 0
    block_size: int = 8


@dataclass(frozen=True)
class Work:
    bytes: float
    flops: float

    def floor_s(self, device: DeviceSpec, dtype: str) -> float:
        """The class's byte floor on `device` for weights of `dtype`."""
        return max(
            self.flops / (FLOP_EFFICIENCY * device.peak_flops(dtype)),
            self.bytes / (BYTE_EFFICIENCY * device.bandwidth),
        )

    def bound(self, device: DeviceSpec, dtype: str) -> str:
        """'bytes' or 'flops': which side of the rule sets the floor."""
        t_flops = self.flops / (FLOP_EFFICIENCY * device.peak_flops(dtype))
        return "flops" if t_flops > self.bytes / (BYTE_EFFICIENCY * device.bandwidth) else "bytes"


def act_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def gemm_shapes(arch: Arch) -> dict[str, tuple[int, int, int]]:
    """(in, out, count) of every projection GEMM of the target, by name."""
    n_attn = arch.layers - arch.gdn_layers
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    shapes = {
        "qkv": (arch.hidden, q + 2 * kv, n_attn),
        "o": (q, arch.hidden, n_attn),
        "gate_up": (arch.hidden, 2 * arch.intermediate, arch.layers),
        "down": (arch.intermediate, arch.hidden, arch.layers),
    }
    if arch.gdn_layers:
        k = arch.gdn_key_heads * arch.gdn_head_dim
        v = arch.gdn_value_heads * arch.gdn_head_dim
        shapes["gdn_in"] = (arch.hidden, 2 * k + 2 * v + 2 * arch.gdn_value_heads, arch.gdn_layers)
        shapes["gdn_out"] = (v, arch.hidden, arch.gdn_layers)
    return shapes


def gemm_work(rows: float, n_in: int, n_out: int, dtype: str) -> Work:
    """One projection GEMM: the weight once, `rows` activations in and out, 2 FLOPs per MAC."""
    return Work(
        n_in * n_out * WEIGHT_BYTES[dtype] + rows * (n_in + n_out) * act_bytes(dtype),
        2 * rows * n_in * n_out,
    )


def linear_params(arch: Arch) -> int:
    """Projection weights of all layers (LM head and embedding excluded)."""
    return sum(i * o * n for i, o, n in gemm_shapes(arch).values())


def lm_head_params(arch: Arch) -> int:
    return arch.vocab * arch.hidden


def recurrent_state_bytes(arch: Arch) -> int:
    """One request's Gated DeltaNet state over all GDN layers."""
    return arch.gdn_layers * arch.gdn_value_heads * arch.gdn_head_dim**2 * STATE_BYTES


def step_work(arch: Arch, dtype: str, drafter: DrafterShape, shape: StepShape) -> dict[str, Work]:
    """Bytes and FLOPs per kernel class for one verify step (see the module docstring)."""
    wb, ab = WEIGHT_BYTES[dtype], act_bytes(dtype)
    rows = shape.rows * shape.batch
    n_attn = arch.layers - arch.gdn_layers
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    shapes = gemm_shapes(arch)

    gemms = [(gemm_work(rows, i, o, dtype), n) for i, o, n in shapes.values()]
    linear = Work(sum(w.bytes * n for w, n in gemms), sum(w.flops * n for w, n in gemms))

    ctx = min(shape.context, arch.sliding_window) if arch.sliding_window else shape.context
    attn_bytes = n_attn * shape.batch * (2 * kv * ctx * ab + shape.rows * (2 * kv + 2 * q) * ab)
    attn_flops = n_attn * rows * 4 * q * (ctx + shape.rows)
    attention = Work(attn_bytes, attn_flops)

    state_flops = arch.gdn_layers * arch.gdn_value_heads * 8 * arch.gdn_head_dim**2
    recurrent = Work(rows * 2 * recurrent_state_bytes(arch), rows * state_flops)

    head = lm_head_params(arch)
    lm_head = Work(head * wb + rows * (arch.hidden * ab + 2 * arch.vocab * LOGIT_BYTES), 2 * head * rows)

    if drafter.params:
        dwb = 2 if dtype == "fp8" else wb
        passes = drafter.block_size if drafter.kind == "eagle3" else 1
        draft = Work(passes * drafter.params * dwb, 2 * drafter.params * drafter.block_size * shape.batch)
    else:
        draft = Work(shape.context * 4 * shape.batch, 0.0)

    norms = 2 * arch.layers + 1
    other_bytes = rows * arch.hidden * ab * (1 + 2 * norms + 3 * 2 * arch.layers)
    other_bytes += norms * arch.hidden * wb + n_attn * rows * (q + kv) * 2 * ab
    other_flops = rows * arch.hidden * (4 * norms + 2 * arch.layers) + n_attn * rows * (q + kv) * 6
    other = Work(other_bytes, other_flops)

    return {
        "linear": linear,
        "attention": attention,
        "recurrent": recurrent,
        "lm_head": lm_head,
        "drafter": draft,
        "other": other,
    }


def floors(work: dict[str, Work], device: DeviceSpec, dtype: str) -> dict[str, float]:
    """Byte floor in seconds per class."""
    return {name: w.floor_s(device, dtype) for name, w in work.items()}
