"""Certified INT8 LM head: argmax identical to the exact head (paper §4.1).

An INT8 copy of the head gives approximate logits with per-row Cauchy–Schwarz bounds; every token
whose upper bound reaches the largest lower bound is rescored exactly with the original rows.
CPU path: torch; GPU path: Triton (M = 1..64 rows). Imports nothing else of SpecPilot.
"""

from .exact import exact_argmax, exact_logits, resolve_argmax
from .head import CertifiedHead, CertifiedResult, certified_argmax
from .quant import QuantizedHead, quantize_head, split_hidden

__all__ = [
    "CertifiedHead",
    "CertifiedResult",
    "QuantizedHead",
    "certified_argmax",
    "exact_argmax",
    "exact_logits",
    "quantize_head",
    "resolve_argmax",
    "split_hidden",
]
