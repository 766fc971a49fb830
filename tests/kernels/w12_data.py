"""Weight distributions for the W12 tests (bf16, seeded)."""

from __future__ import annotations

import torch


def trained_like(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Weights that look like a trained bf16 checkpoint: a Gaussian mix per channel (channel scales
    spread over ~4x), heavy Student-t tails and a few large outliers."""
    g = torch.Generator().manual_seed(seed)
    scale = 0.02 * torch.exp(torch.randn(n, 1, generator=g) * 0.35)
    w = torch.randn(n, k, generator=g) * scale
    wide = torch.rand(n, k, generator=g) < 0.1
    w = torch.where(wide, w * 3, w)
    t = torch.distributions.StudentT(3.0).sample((n, k)) * scale * 0.5
    tail = torch.rand(n, k, generator=g) < 0.01
    w = torch.where(tail, t, w)
    out = torch.rand(n, k, generator=g) < 1e-5
    w = torch.where(out, torch.randn(n, k, generator=g) * 2.0, w)
    return w.to(torch.bfloat16)


def random_bits(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Every 16-bit pattern equally likely: zeros, denormals, inf, NaN payloads, all exponents."""
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(-32768, 32768, (n, k), generator=g, dtype=torch.int32)
        .to(torch.int16)
        .view(torch.bfloat16)
    )


def with_specials(w: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """w with zeros (both signs), denormals, inf, NaN and far outliers sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    w = w.clone()
    flat = w.view(-1)
    specials = [0.0, -0.0, 1e-40, -3e-39, float("inf"), float("-inf"), float("nan"), 1e4, -3e-20]
    idx = torch.randint(0, flat.numel(), (len(specials) * 8,), generator=g)
    for i, j in enumerate(idx.tolist()):
        flat[j] = specials[i % len(specials)]
    # a NaN with a payload and a negative-sign NaN, set through the bits
    flat.view(torch.int16)[int(idx[0])] = 0x7FC5
    flat.view(torch.int16)[int(idx[1])] = -0x0041  # 0xFFBF: sign set, NaN, payload 0x3F
    return w
