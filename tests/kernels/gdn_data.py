"""Inputs for the GDN tests: tokens of one GDN layer (bf16 q, k, v; fp32 log decay; beta) and trees."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def tokens(n: int, h: int, hv: int, kd: int, vd: int, seed: int = 0, device="cpu"):
    """n tokens' q, k, v (bf16), g (fp32 log decay, as Qwen3-Next's -exp(A) softplus(a + dt)), beta (bf16)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, h, kd, generator=gen).to(torch.bfloat16)
    k = torch.randn(n, h, kd, generator=gen).to(torch.bfloat16)
    v = torch.randn(n, hv, vd, generator=gen).to(torch.bfloat16)
    a_log = torch.rand(hv, generator=gen) * 2 - 1
    g = -torch.exp(a_log) * F.softplus(torch.randn(n, hv, generator=gen) - 2)
    beta = torch.sigmoid(torch.randn(n, hv, generator=gen)).to(torch.bfloat16)
    return [x.to(device) for x in (q, k, v, g, beta)]


def state(hv: int, kd: int, vd: int, seed: int = 1, device="cpu"):
    """A committed state of the magnitude a GDN state has after a prompt (entries ~ 0.1)."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(hv, kd, vd, generator=gen) * 0.1).to(device)


def random_tree(n: int, seed: int = 0) -> list[int]:
    """Parents of a tree of n nodes in verification order, bushy near the root like a draft tree."""
    gen = torch.Generator().manual_seed(seed)
    parents = []
    for i in range(n):
        lo = max(-1, i - 6)
        parents.append(int(torch.randint(lo, i, (1,), generator=gen)) if i else -1)
    return parents
