"""Pure-torch reference paths of the W12 GEMMs (any device, no Triton)."""

from __future__ import annotations

import torch

from .codec import decode
from .format import W12Tensor


def reference_matmul(x: torch.Tensor, t: W12Tensor, qpass: bool = False) -> torch.Tensor:
    """y = x @ W^T with W decoded from W12 (the Q pass's weights if `qpass`), fp32 accumulation.

    Returns x's dtype. This is the semantics the Triton kernels implement; they differ from it
    only in the order of the fp32 additions.
    """
    w = decode(t, qpass=qpass).to(device=x.device)
    y = torch.nn.functional.linear(x.float(), w.float())
    return y.to(x.dtype)


def exact_matmul_fp64(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The fp64 reference y = x @ W^T the tests measure every GEMM against."""
    return x.double() @ w.double().t()
