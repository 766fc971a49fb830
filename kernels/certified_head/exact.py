"""The exact head: what "argmax identical to the exact head" compares against.

Definition. The exact logit of token v for a hidden state h is the real number
z_v = sum_i w_vi h_i over the *stored* values (fp32, bf16 or fp16 rows and hidden states, read as
the rationals they are). The exact head's argmax is the smallest v with z_v = max_u z_u (the same
tie rule as `torch.argmax`). This is a mathematical function of the stored tensors, so it does not
depend on a GEMM's tile shape, split-K or summation order; a bf16 or fp32 GEMM's argmax agrees
with it except where its own rounding flips a near-tie.

Computation. Products of two values with <= 24 significant bits are exact in float64, so a
float64 dot product in any order (any BLAS, any tree, FMA or not) satisfies the standard bound
|fl(z_v) - z_v| <= gamma_H * S_v with S_v = sum_i |w_vi h_i| and gamma_H = H u / (1 - H u),
u = 2^-53. `exact_logits` returns fl(z_v) and err_v = (H + 8) 2^-51 fl(S_v), which is at least 4x
that bound, so it also absorbs the rounding of fl(S_v) and of the comparisons made with it.
`resolve_argmax` takes the float64 leader; any token whose interval [fl(z) - err, fl(z) + err]
meets the leader's is compared with it exactly: the sign of z_a - z_b equals the sign of
math.fsum over the 2H exact float64 products (fsum is correctly rounded, and every product is a
multiple of 2^-298, so a nonzero exact difference never rounds to zero).

`exact_argmax` applies this to all V rows (the reference); the certified head applies it to its
survivors only. Both return the same index whenever the survivors contain every token whose
exact logit can equal the maximum, which is what the bounds guarantee.
"""

from __future__ import annotations

import math

import torch

_U = 2.0**-53


def err_factor(hidden_size: int) -> float:
    """err_v = err_factor(H) * fl(sum_i |w_vi h_i|) bounds the float64 rounding of z_v (4x slack)."""
    return (hidden_size + 8) * 4.0 * _U


def exact_logits(
    weight: torch.Tensor, hidden: torch.Tensor, rows: torch.Tensor | None = None, chunk: int = 16384
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 logits fl(z) [M, R] and their rounding bounds err [M, R] for `rows` (default: all).

    Runs on the weight's device, `chunk` rows at a time (float64 temporaries of chunk x H).
    """
    h = hidden.to(device=weight.device, dtype=torch.float64)
    ha = h.abs()
    n = weight.shape[0] if rows is None else rows.numel()
    z = torch.empty((h.shape[0], n), dtype=torch.float64, device=weight.device)
    err = torch.empty_like(z)
    f = err_factor(weight.shape[1])
    for lo in range(0, n, chunk):
        w = weight[lo : lo + chunk] if rows is None else weight[rows[lo : lo + chunk]]
        w = w.to(torch.float64)
        z[:, lo : lo + chunk] = h @ w.T
        err[:, lo : lo + chunk] = (ha @ w.abs().T) * f
    return z, err


def exact_sign(weight: torch.Tensor, hidden_row: torch.Tensor, a: int, b: int) -> int:
    """The exact sign of z_a - z_b (-1, 0 or 1) through math.fsum of the exact float64 products."""
    h = hidden_row.detach().to("cpu", torch.float64)
    wa = weight[a].detach().to("cpu", torch.float64)
    wb = weight[b].detach().to("cpu", torch.float64)
    terms = torch.cat([wa * h, -(wb * h)]).tolist()
    d = math.fsum(terms)
    return (d > 0) - (d < 0)


def resolve_argmax(
    weight: torch.Tensor, hidden_row: torch.Tensor, cand: torch.Tensor, z: torch.Tensor, err: torch.Tensor
) -> int:
    """The exact argmax (smallest index among exact ties) among candidate rows `cand`.

    `z`, `err` are `exact_logits` of the candidates for this hidden row. Candidates whose
    intervals cannot reach the float64 leader's are discarded without exact arithmetic.
    """
    cand_l = cand.detach().to("cpu", torch.int64)
    z_l = z.detach().to("cpu", torch.float64)
    e_l = err.detach().to("cpu", torch.float64)
    top = z_l.max()
    lead = int(cand_l[z_l == top].min())
    lead_err = float(e_l[(cand_l == lead).nonzero()[0, 0]])
    close = (top - z_l <= lead_err + e_l) & (cand_l != lead)
    if not bool(close.any()):
        return lead
    best = lead
    for c in sorted(int(x) for x in cand_l[close]):
        s = exact_sign(weight, hidden_row, c, best)
        if s > 0 or (s == 0 and c < best):
            best = c
    return best


def exact_argmax(weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The exact head's argmax [M] (int64, on the weight's device) over all rows: the reference."""
    hidden = hidden.reshape(-1, weight.shape[1])
    z, err = exact_logits(weight, hidden)
    out = []
    all_rows = torch.arange(weight.shape[0], device=weight.device)
    for m in range(hidden.shape[0]):
        # Only rows that can reach the float64 leader matter; the rest cannot be the argmax.
        top = z[m].max()
        near = (top - z[m]) <= (err[m].max() * 2)
        idx = all_rows[near]
        out.append(resolve_argmax(weight, hidden[m], idx, z[m][near], err[m][near]))
    return torch.tensor(out, dtype=torch.int64, device=weight.device)
