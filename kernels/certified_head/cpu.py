"""Approximate logits and certified bounds on the CPU (torch only).

Two ways to compute the approximate logits C_v ~ s_v (q_v . h), chosen by `method`:

- "int8pack": torch.ops.aten._weight_int8pack_mm(a, q, s) with a = bf16(h). Every CPU kernel of
  that op (int8mm_kernel.cpp: AVX2, AVX-512, NEON and the scalar fallback) converts q and a to
  float32, multiplies by s and accumulates in float32 in some order, then rounds the sum to bf16.
  Reads V*H bytes of int8 (a quarter of the fp32 head).
- "dequant": float32 F.linear(h, s q) against a float32 dequantized copy (s q is exact in fp32:
  8 x 8 significant bits). No byte saving; the portable fallback.

Bound (int8pack). Let d = h - a (exact in float64), C' the float32 sum before the bf16 rounding.
    z_v = s_v q_v . a + s_v q_v . d + e_v . h
    |e_v . h|        <= err_norm_v ||h||                                  (Cauchy-Schwarz)
    |s_v q_v . d|    <= deq_norm_v ||d||                                  (Cauchy-Schwarz)
    |C' - s_v q_v.a| <= gamma_{H+2} sum_i |a_i| |s_v q_vi| <= gamma_{H+2} deq_norm_v ||a||
                        (each term a_i * fl(q_vi s_v) carries <= H + 2 roundings, any order)
    |C - C'|         <= 2^-9 |C'| <= 2^-8 |C|                           (bf16 rounding of C')
so |z_v - C_v| <= Delta_v = err_norm_v ||h|| + deq_norm_v (||d|| + gamma_{H+2} ||a|| 1.004)
+ 2^-8 |C_v|. (dequant: Delta_v = err_norm_v ||h|| + gamma_{H+1} deq_norm_v ||h||.)
Delta is evaluated in float32 as a rank-3 product plus a multiple of |C| (see cpu_bounds), every
factor widened so the float32 roundings cannot undercut it, plus 1e-30 for underflow, so the
stored lower <= z_v <= upper holds for the real z_v.
"""

from __future__ import annotations

import torch

from .quant import QuantizedHead, norm_up, up_to_float32

_U32 = 2.0**-24


def int8pack_available() -> bool:
    """Whether this torch has the CPU int8 weight-only matmul."""
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


# The op's vector kernels read A with aligned 16/32-byte loads and step K by 8/16 with no tail, so
# K must be a multiple of 32 (zero columns, appended to q and a alike, add exactly nothing).
PACK_K = 32


def int8pack_weight(head: QuantizedHead) -> torch.Tensor:
    """q padded with zero columns to a multiple of PACK_K (q itself when it already is one)."""
    H = head.hidden_size
    if H % PACK_K == 0:
        return head.q
    qp = torch.zeros((head.vocab_size, -(-H // PACK_K) * PACK_K), dtype=torch.int8)
    qp[:, :H] = head.q
    return qp


def bound_cols(head: QuantizedHead) -> torch.Tensor:
    """[3, V] float32: err_norm, deq_norm and ones, the right factor of Delta's rank-3 product."""
    return torch.stack([head.err_norm, head.deq_norm, torch.ones_like(head.err_norm)])


def cpu_bounds(
    head: QuantizedHead,
    hidden: torch.Tensor,
    method: str = "int8pack",
    operand: torch.Tensor | None = None,
    cols: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower, upper) [M, V] float32 with lower <= z <= upper for every exact logit z.

    `operand`: the prepared weight operand (int8pack_weight(head) or the float32 dequantized
    copy) and `cols` = bound_cols(head); both built on the fly when omitted.
    """
    H = head.hidden_size
    h64 = hidden.to(torch.float64)
    h_norm = norm_up(h64).to(torch.float64)
    if method == "int8pack":
        qp = int8pack_weight(head) if operand is None else operand
        a = hidden.to(torch.bfloat16)
        if qp.shape[1] != H:
            a = torch.nn.functional.pad(a, (0, qp.shape[1] - H))
        c = torch.ops.aten._weight_int8pack_mm(a.contiguous(), qp, head.scale.to(torch.bfloat16))
        c = c.to(torch.float32)
        a = a[:, :H]
        d_norm = norm_up(h64 - a.to(torch.float64)).to(torch.float64)
        a_norm = norm_up(a).to(torch.float64)
        gamma = (H + 2) * _U32 / (1 - (H + 2) * _U32)
        k = d_norm + gamma * a_norm * 1.004  # per hidden row: the factor of deq_norm_v
        c_rel = 2.0**-8
    elif method == "dequant":
        dequant = head.q.to(torch.float32) * head.scale[:, None] if operand is None else operand
        c = torch.nn.functional.linear(hidden.to(torch.float32), dequant)
        k = h_norm * ((H + 1) * _U32 / (1 - (H + 1) * _U32) * 1.001)
        c_rel = 0.0
    else:
        raise ValueError(f"unknown CPU method {method!r}: use 'int8pack' or 'dequant'")
    # Delta = [||h||, k, 1e-30] @ [err_norm; deq_norm; 1] + (c_rel + 2^-21)|C|, every factor
    # widened by (1 + 2^-17) > 1 / (1 - 5u): the float32 evaluation (<= 5 roundings of
    # non-negative terms) cannot fall below the real Delta; 2^-21 |C| covers rounding C -+ Delta.
    wide = 1 + 2.0**-17
    rows = torch.stack([h_norm * wide, k * wide, torch.full_like(k, 1e-30)], 1)
    delta = up_to_float32(rows) @ (bound_cols(head) if cols is None else cols)
    delta.add_(c.abs(), alpha=(c_rel + 2.0**-21) * wide)
    lower, upper = c - delta, c + delta
    # An overflowed C (inf - inf) must widen the interval, never drop the token.
    inf = float("inf")
    torch.nan_to_num_(lower, nan=-inf, posinf=inf, neginf=-inf)
    torch.nan_to_num_(upper, nan=inf, posinf=inf, neginf=-inf)
    return lower, upper
