"""The certified INT8 LM head: argmax identical to the exact head, from an INT8 copy plus rescoring.

For hidden states h [M, H] and the head W [V, H]:
 1. approximate logits from the INT8 copy, with certified bounds lower_v <= z_v <= upper_v on every
    exact logit z_v = w_v . h (quant.py, cpu.py, triton_kernels.py derive them);
 2. survivors S = {v : upper_v >= max_u lower_u};
 3. exact rescoring of the survivors with the original rows (exact.py), argmax with ties to the
    smallest index.

Theorem. Let v* be the exact head's argmax. For every u, upper_v* >= z_v* >= z_u >= lower_u, so
upper_v* >= max_u lower_u and v* is in S; the same holds for every v with z_v = z_v*. Rescoring
decides the exact order within S (float64 with a rounding bound, exact fsum comparison where the
bound leaves two candidates too close), so the returned index is v*. This holds for any inputs
with finite values; only the survivor count (speed) depends on the data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cpu import bound_cols, cpu_bounds, int8pack_available, int8pack_weight
from .exact import exact_logits, resolve_argmax
from .quant import QuantizedHead, quantize_head

# Rows per launch of the Triton path (its tiles hold up to 64 padded rows).
MAX_ROWS = 64


@dataclass
class CertifiedResult:
    """argmax and survivor counts shaped like the hidden states' leading dims."""

    argmax: torch.Tensor  # int64, on the hidden states' device
    n_survivors: torch.Tensor  # int64
    host_argmax: torch.Tensor | None = None  # the same on the CPU (the Triton path's one synchronization)
    survivors: list[torch.Tensor] | None = None  # per flattened row: survivor indices (int64)
    logits: list[torch.Tensor] | None = None  # per flattened row: float64 rescored logits of the survivors


class CertifiedHead:
    """An LM head W [V, H] prepared for certified argmax on CPU (torch) or CUDA (Triton).

    backend: "auto" (Triton for CUDA weights, torch otherwise), "torch" or "triton" (the latter on
    CPU tensors only under TRITON_INTERPRET=1). cpu_method: "auto" (int8pack when torch has it),
    "int8pack" or "dequant"; see cpu.py. cap: survivor slots per row on the Triton path (more
    survivors take the slower exact fallback, never a wrong answer). configs: Triton tile configs
    keyed by the largest M they serve (gpu.KernelConfig; default one config for all M).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        backend: str = "auto",
        cpu_method: str = "auto",
        cap: int = 4096,
        configs: dict | None = None,
        quant: QuantizedHead | None = None,
    ):
        # `quant`: an already quantized copy of this weight (saves the quantization pass).
        self.quant: QuantizedHead = quant if quant is not None else quantize_head(weight.detach())
        if backend == "auto":
            backend = "triton" if weight.is_cuda else "torch"
        if backend not in ("torch", "triton"):
            raise ValueError(f"unknown backend {backend!r}: use 'auto', 'torch' or 'triton'")
        self.backend = backend
        if cpu_method == "auto":
            cpu_method = "int8pack" if int8pack_available() else "dequant"
        self.cpu_method = cpu_method
        self._operand = None
        if backend == "torch" and cpu_method == "dequant":
            self._operand = self.quant.q.to(torch.float32) * self.quant.scale[:, None]
        elif backend == "torch" and cpu_method == "int8pack":
            self._operand = int8pack_weight(self.quant)
        self._cols = bound_cols(self.quant) if backend == "torch" else None
        self._triton = None
        if backend == "triton":
            from .gpu import TritonHead  # noqa: PLC0415

            self._triton = TritonHead(self.quant, cap=cap, configs=configs)

    @property
    def weight(self) -> torch.Tensor:
        return self.quant.weight

    def _rows(self, hidden: torch.Tensor) -> torch.Tensor:
        H = self.quant.hidden_size
        if hidden.shape[-1] != H:
            raise ValueError(f"hidden states end in {hidden.shape[-1]}, the head expects {H}")
        if hidden.device != self.weight.device:
            raise ValueError(f"hidden states are on {hidden.device}, the head on {self.weight.device}")
        return hidden.reshape(-1, H)

    def bounds(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(lower, upper) [M, V] float32 bounds on every exact logit (for checks and callers)."""
        x = self._rows(hidden)
        if self.backend == "torch":
            return cpu_bounds(self.quant, x, self.cpu_method, self._operand, self._cols)
        los, ups = [], []
        for lo in range(0, x.shape[0], MAX_ROWS):
            piece = x[lo : lo + MAX_ROWS].contiguous()
            b = self._triton.buffers(piece.shape[0])
            self._triton.launch(piece, b, write_lower=True)
            los.append(b.lo.clone())
            ups.append(b.up.clone())
        return torch.cat(los), torch.cat(ups)

    def argmax(
        self, hidden: torch.Tensor, return_logits: bool = False, use_graph: bool = False
    ) -> CertifiedResult:
        """Certified argmax of hidden [..., H]: identical to the exact head's (see module doc)."""
        lead = hidden.shape[:-1]
        x = self._rows(hidden)
        if self.backend == "triton":
            args, cnts, hosts, survs = [], [], [], []
            # The kernels' tiles are sized for up to MAX_ROWS rows (shared memory); more go in pieces.
            for lo in range(0, x.shape[0], MAX_ROWS):
                arg, cnt, b, host = self._triton.run(x[lo : lo + MAX_ROWS], use_graph=use_graph)
                args.append(arg)
                cnts.append(cnt)
                hosts.append(host)
                if return_logits:
                    survs += [self._triton.survivors(b, m) for m in range(b.M)]
            arg, cnt = (args[0], cnts[0]) if len(args) == 1 else (torch.cat(args), torch.cat(cnts))
            host = hosts[0] if len(hosts) == 1 else torch.cat(hosts)
            res = CertifiedResult(arg.reshape(lead), cnt.reshape(lead), host.reshape(lead))
            if return_logits:
                res.survivors = survs
                res.logits = [exact_logits(self.weight, x[m : m + 1], s)[0][0] for m, s in enumerate(survs)]
            return res
        if not bool(torch.isfinite(x).all()):
            raise ValueError("hidden states contain inf or NaN; the certified head needs finite inputs")
        lower, upper = cpu_bounds(self.quant, x, self.cpu_method, self._operand, self._cols)
        keep = upper >= lower.max(1, keepdim=True).values
        # One float64 rescoring pass over the union of all rows' survivors.
        union = keep.any(0).nonzero().flatten()
        z_all, err_all = exact_logits(self.weight, x, union)
        args, counts, survs, logits = [], [], [], []
        for m in range(x.shape[0]):
            sel = keep[m, union]
            rows = union[sel]
            args.append(resolve_argmax(self.weight, x[m], rows, z_all[m, sel], err_all[m, sel]))
            counts.append(rows.numel())
            survs.append(rows)
            logits.append(z_all[m, sel])
        arg = torch.tensor(args, dtype=torch.int64).reshape(lead)
        res = CertifiedResult(arg, torch.tensor(counts, dtype=torch.int64).reshape(lead), arg)
        if return_logits:
            res.survivors, res.logits = survs, logits
        return res


def certified_argmax(head: CertifiedHead, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for `(hidden @ W.T).argmax(-1)` in a verify step: (argmax, n_survivors).

    Contract: argmax identical to the exact head (the argmax of the exact dot products of the
    stored weights and hidden states, smallest index on ties). Shapes follow hidden's leading dims.
    """
    res = head.argmax(hidden)
    return res.argmax, res.n_survivors
