"""Per-row symmetric INT8 quantization of an LM head, with certified per-row error norms.

For every vocabulary row w_v (length H) of the head W [V, H]:

    s_v  = max_i |w_vi| / 127, rounded *up* to a bfloat16 value (so s_v is exact in fp32 and bf16,
           and |w_vi / s_v| <= 127 before rounding; CPU int8 kernels want bf16 scales),
    q_v  = round(w_v / s_v) in [-127, 127] (int8),
    e_v  = w_v - s_v q_v (the quantization error, computed exactly in float64: w has <= 24
           significant bits, s_v q_v <= 16, and where q_vi != 0 their exponents are within 8 of
           each other, so the difference fits in 53 bits; where q_vi == 0, e_vi = w_vi),
    err_norm[v] >= ||e_v||_2  and  deq_norm[v] >= ||s_v q_v||_2, both float32 rounded upward.

Only the int8 rows, the scales and the two norms are read by the approximate pass; `weight` (the
original rows, untouched) is what survivors are rescored with.

The hidden-state side (`split_hidden`) writes h = t1 p1 + t2 p2 + r with p1, p2 int8 limbs, so
that q_v . h = t1 (q_v . p1) + t2 (q_v . p2) + q_v . r with both integer dot products exact in
int32 (|q . p| <= 127^2 H < 2^31 for H < 133,000) and ||r||_2 about 2^-16 ||h||_2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Rows processed at once when quantizing (float64 temporaries of CHUNK x H).
CHUNK = 8192
# Relative slack added before rounding a float64 norm to float32: covers the float64 rounding of
# the sum of squares (gamma_H < 2^-37 for H < 2^16) and of the square root with a wide margin.
_NORM_SLACK = 2.0**-30
SUPPORTED = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class QuantizedHead:
    """An LM head W [V, H] with its per-row INT8 copy and certified error norms."""

    weight: torch.Tensor  # [V, H] the original rows (fp32 / bf16 / fp16), used for exact rescoring
    q: torch.Tensor  # [V, H] int8 in [-127, 127]
    scale: torch.Tensor  # [V] float32, bf16-representable, > 0
    err_norm: torch.Tensor  # [V] float32 >= ||w_v - s_v q_v||_2
    deq_norm: torch.Tensor  # [V] float32 >= ||s_v q_v||_2

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.weight.shape[1]


def up_to_float32(x: torch.Tensor) -> torch.Tensor:
    """float64 -> the smallest float32 >= x (elementwise; x finite)."""
    f = x.to(torch.float32)
    return torch.where(f.to(torch.float64) < x, torch.nextafter(f, torch.full_like(f, float("inf"))), f)


def up_to_bfloat16(x: torch.Tensor) -> torch.Tensor:
    """Positive float64 -> the smallest bfloat16 >= x (returned as float32, which holds it exactly)."""
    b = x.to(torch.bfloat16)
    bits = b.view(torch.int16)
    # For positive bf16 values the next representable one up is the bit pattern + 1.
    bumped = torch.where(b.to(torch.float64) < x, bits + 1, bits).view(torch.bfloat16)
    return bumped.to(torch.float32)


def norm_up(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """A float32 upper bound on the 2-norm along `dim` of a tensor whose elements are exact in float64."""
    x = x.to(torch.float64)
    sq = (x * x).sum(dim) * (1.0 + _NORM_SLACK)
    return up_to_float32(sq.sqrt() * (1.0 + _NORM_SLACK))


def quantize_head(weight: torch.Tensor, chunk: int = CHUNK) -> QuantizedHead:
    """Quantize every row of `weight` [V, H] to INT8 with a bf16-representable scale.

    Runs on the weight's device. Raises ValueError for a non-2D, unsupported-dtype or non-finite
    weight (the bounds are meaningless for inf/NaN rows).
    """
    if weight.dim() != 2:
        raise ValueError(f"the LM head weight must be [vocab, hidden], got shape {tuple(weight.shape)}")
    if weight.dtype not in SUPPORTED:
        raise ValueError(f"LM head dtype {weight.dtype} is not supported: use one of {SUPPORTED}")
    if not bool(torch.isfinite(weight).all()):
        raise ValueError("the LM head weight contains inf or NaN; certified bounds need finite rows")
    weight = weight.contiguous()
    V, H = weight.shape
    q = torch.empty((V, H), dtype=torch.int8, device=weight.device)
    scale = torch.empty(V, dtype=torch.float32, device=weight.device)
    err_norm = torch.empty_like(scale)
    deq_norm = torch.empty_like(scale)
    for lo in range(0, V, chunk):
        w = weight[lo : lo + chunk].to(torch.float64)
        amax = w.abs().amax(1)
        # All-zero rows get scale 1 (q = 0, e = 0); tiny rows keep a positive normal scale.
        s = up_to_bfloat16(torch.where(amax > 0, amax / 127.0, torch.ones_like(amax)))
        s64 = s.to(torch.float64)
        qi = torch.round(w / s64[:, None]).clamp_(-127, 127)
        q[lo : lo + chunk] = qi.to(torch.int8)
        scale[lo : lo + chunk] = s
        err_norm[lo : lo + chunk] = norm_up(w - s64[:, None] * qi)
        deq_norm[lo : lo + chunk] = norm_up(s64[:, None] * qi)
    return QuantizedHead(weight=weight, q=q, scale=scale, err_norm=err_norm, deq_norm=deq_norm)


@dataclass(frozen=True)
class SplitHidden:
    """h [M, H] = t1 p1 + t2 p2 + r, with int8 limbs p1, p2 and certified norms."""

    p1: torch.Tensor  # [M, H] int8
    p2: torch.Tensor  # [M, H] int8
    t1: torch.Tensor  # [M] float32
    t2: torch.Tensor  # [M] float32
    h_norm: torch.Tensor  # [M] float32 >= ||h||_2
    r_norm: torch.Tensor  # [M] float32 >= ||r||_2


def split_hidden(hidden: torch.Tensor) -> SplitHidden:
    """Two-limb int8 split of hidden states [M, H] (the torch reference of the Triton prologue).

    Any integer choice of p1, p2 keeps the identity exact (r absorbs the rest); rounding to
    nearest only makes r small. Every step is exact in float64 (h has <= 24 significant bits,
    t p <= 32), so r_norm bounds the true residual.
    """
    h = hidden.to(torch.float64)
    t1 = _limb_scale(h.abs().amax(1))
    p1 = torch.floor(h / t1[:, None] + 0.5).clamp_(-127, 127)
    r1 = h - t1[:, None] * p1
    t2 = _limb_scale(r1.abs().amax(1))
    p2 = torch.floor(r1 / t2[:, None] + 0.5).clamp_(-127, 127)
    r = r1 - t2[:, None] * p2
    return SplitHidden(
        p1=p1.to(torch.int8),
        p2=p2.to(torch.int8),
        t1=t1.to(torch.float32),
        t2=t2.to(torch.float32),
        h_norm=norm_up(h),
        r_norm=norm_up(r),
    )


def _limb_scale(amax: torch.Tensor) -> torch.Tensor:
    """amax / 127 as a float32 value (returned in float64), 1 where amax is 0."""
    t = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax)).to(torch.float32)
    return t.to(torch.float64)
