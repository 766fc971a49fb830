"""Drop-in W12 linear layers: replace a model's nn.Linear weights with W12, losslessly.

`convert_model(model)` swaps every bf16 nn.Linear (except the names in `skip`) for a W12Linear
built from the same weight, checking each restored weight bit for bit against its source (the
load-time check). On CUDA a W12Linear runs the W12 GEMM for up to 64 rows and decodes to bf16 for
larger row counts (prefill: compute-bound, where 12-bit reads buy nothing); elsewhere it decodes
once and uses torch (the reference path). `qpass=True` switches a layer to the Q pass's 8-bit view:
output-changing, for draft/inspection passes only.
"""

from __future__ import annotations

import torch
from torch import nn

from .codec import decode, encode, verify
from .format import W12FormatError, W12Tensor

GEMM_MAX_ROWS = 64  # the W12 GEMM's tile; more rows decode the weight and use cuBLAS


class W12Linear(nn.Module):
    """y = x W^T + b with W stored in W12 (12 bits per weight plus escapes; raw rows at 16)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, check: bool = True):
        super().__init__()
        if weight.dtype != torch.bfloat16:
            raise W12FormatError(
                f"W12Linear needs a bf16 weight to be lossless, got {weight.dtype}; "
                "convert the model to bf16 first (or pass cast=True to convert_model)"
            )
        t = encode(weight.detach())
        if check:
            verify(t, weight.detach())
        self.shape = t.shape
        self.in_features, self.out_features = t.k_in, t.n_out
        for name in W12Tensor.PARTS:
            self.register_buffer(name, getattr(t, name))
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.qpass = False
        self._dense: dict[tuple[torch.device, bool], torch.Tensor] = {}
        self._w12: W12Tensor | None = None

    @classmethod
    def from_linear(cls, lin: nn.Linear, check: bool = True) -> W12Linear:
        return cls(lin.weight, lin.bias, check=check)

    @property
    def w12(self) -> W12Tensor:
        """The weight as a W12Tensor (one object per device, so its coded-row index is built once)."""
        t = self._w12
        if t is None or t.records is not self.records:
            t = self._w12 = W12Tensor(self.shape, *(getattr(self, p) for p in W12Tensor.PARTS))
            if t.n_raw:
                t.coded_rows()
        return t

    def dense(self) -> torch.Tensor:
        """The bf16 weight (exact; the Q pass's weights when qpass). Cached off CUDA only."""
        key = (self.records.device, self.qpass)
        if key in self._dense:
            return self._dense[key]
        w = decode(self.w12, qpass=self.qpass)
        if not self.records.is_cuda:  # CPU: the reference path, decode once
            self._dense = {key: w}
        return w

    def _apply(self, fn, recurse=True):
        self._dense, self._w12 = {}, None  # a device or dtype move invalidates the decoded copy
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(x.shape[-1], 1)
        if x.is_cuda and x.dtype == torch.bfloat16 and rows <= GEMM_MAX_ROWS:
            from .gemm import w12_matmul

            return w12_matmul(x, self.w12, qpass=self.qpass, bias=self.bias)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return torch.nn.functional.linear(x, self.dense().to(x.dtype), bias)  # nn.Linear's own op

    def extra_repr(self) -> str:
        t = self.w12
        return f"in={t.k_in}, out={t.n_out}, bits/weight={t.bits_per_weight():.3f}, qpass={self.qpass}"


def convert_model(
    model: nn.Module, skip: tuple[str, ...] = ("lm_head",), cast: bool = False, check: bool = True
) -> dict[str, dict]:
    """Replace every nn.Linear of `model` (in place) whose name has no part in `skip` by W12Linear.

    Weights must be bf16 (lossless); `cast=True` first rounds other dtypes to bf16, which changes
    the model's output and is labelled so in the returned stats. Returns per-layer stats
    (bits/weight, escape rate).
    """
    stats: dict[str, dict] = {}
    targets = [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and not any(s in name.split(".") for s in skip)
    ]
    for name, lin in targets:
        w = lin.weight
        if w.dtype != torch.bfloat16:
            if not cast:
                raise W12FormatError(
                    f"layer {name!r} has {w.dtype} weights; W12 is lossless only for bf16: "
                    "call model.to(torch.bfloat16) first, or pass cast=True (output-changing)"
                )
            w = w.to(torch.bfloat16)
        new = W12Linear(w, lin.bias, check=check)
        parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        setattr(parent, name.rpartition(".")[2], new)
        stats[name] = {**new.w12.stats(), "cast_from": None if w is lin.weight else str(lin.weight.dtype)}
    return stats


def set_qpass(model: nn.Module, on: bool) -> None:
    """Switch every W12Linear of `model` to (or back from) the Q pass's 8-bit view."""
    for mod in model.modules():
        if isinstance(mod, W12Linear):
            mod.qpass = on
