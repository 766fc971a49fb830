"""Inputs for the certified-head tests: realistic, hostile and adversarial heads and hidden states.

Shared by the CPU tests, the Triton-interpreter tests and the GPU tests.
"""

from __future__ import annotations

import functools

import pytest
import torch

from specpilot.kernels.certified_head import exact_logits, quantize_head


def realistic_head(V: int, H: int, gen: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    """Gaussian rows with log-normally spread norms (median ~1) and a few heavier columns.

    Made on the generator's device.
    """
    dev = gen.device
    w = torch.randn(V, H, generator=gen, device=dev)
    w = w / w.norm(dim=1, keepdim=True) * torch.exp(0.35 * torch.randn(V, 1, generator=gen, device=dev))
    cols = torch.randint(0, H, (max(1, H // 64),), generator=gen, device=dev)
    w[:, cols] *= 3.0
    return w.to(dtype)


def realistic_hidden(W: torch.Tensor, M: int, gen: torch.Generator, std: float = 3.0) -> torch.Tensor:
    """Hidden states whose logits look like a language model's: spread `std`, a leader 5-9 std above.

    h = isotropic part (logit spread ~std) + a pull toward one or two target rows + a few
    outlier coordinates (massive activations), in W's dtype.
    """
    V, H = W.shape
    dev = gen.device
    Wf = W.to(torch.float32)
    med = Wf.norm(dim=1).median()
    h = torch.randn(M, H, generator=gen, device=dev) * (std / med)  # isotropic logit spread ~ std
    tgt = torch.randint(0, V, (M, 2), generator=gen, device=dev)
    lift = std * (5 + 4 * torch.rand(M, 1, generator=gen, device=dev))
    for j, frac in ((0, 1.0), (1, 0.9)):
        u = Wf[tgt[:, j]]
        h += (lift * frac) * u / (u * u).sum(1, keepdim=True)
    out = torch.randint(0, H, (3,), generator=gen, device=dev)
    h[:, out] += 20 * torch.randn(M, 3, generator=gen, device=dev).abs() * h.abs().mean()
    return h.to(W.dtype)


def hostile_head(V: int, H: int, gen: torch.Generator) -> torch.Tensor:
    """Rows that stress the bound: huge and tiny norms, one-spike rows, constant rows, zeros."""
    dev = gen.device
    w = torch.randn(V, H, generator=gen, device=dev)
    w[0::7] *= 1e3  # large-norm rows
    w[1::7] *= 1e-20  # tiny rows
    w[2::7, 0] = 1e4  # one huge spike (skewed)
    w[3::7] = 0.7  # constant rows: quantization error exactly 0 or one-sided
    w[4::7] = torch.where(
        torch.rand(w[4::7].shape, generator=gen, device=dev) < 0.97, 0.0, w[4::7] * 50
    )  # sparse spikes
    w[5] = 0.0  # an all-zero row
    return w


def hostile_hidden(M: int, H: int, gen: torch.Generator) -> torch.Tensor:
    """Huge rows, outlier features, mostly-zero rows (on the generator's device)."""
    dev = gen.device
    h = torch.randn(M, H, generator=gen, device=dev)
    h[0::3] *= 1e4
    h[1::3, :5] *= 1e3  # outlier features
    h[2::3] = torch.where(torch.rand(h[2::3].shape, generator=gen, device=dev) < 0.9, 0.0, h[2::3])
    return h


def near_tie_int8_wrong(H: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Two rows a (higher index) and b with z_a > z_b by a hair while INT8 ranks b above a.

    b = s (q + 1_i) is exactly representable in INT8; a = s q + lam s sign(h) keeps q as its
    INT8 copy (|lam| < 1/2) but gains lam s sum|h_j| ~ s h_i from its quantization error.
    Returns (rows [2, H] ordered (b, a), h [H], index of a, index of b) within the pair.
    """
    h = torch.randn(H, generator=gen)
    q = torch.round(127 * h / h.abs().max())  # aligned with h so the pair leads any random head
    s = 2.0**-7  # a power of two: exact in bf16, and every product below is exact
    # The largest usable h_i makes the designed gap (1e-2 s h_i) dwarf the float32 rounding of a.
    i = int(torch.where((h > 0) & (q.abs() < 120), h, torch.zeros_like(h)).argmax())
    b = s * q.clone()
    b[i] += s
    sgn = torch.sign(h)
    sgn[i] = 0.0
    sgn[q.abs() == 127] = 0.0  # keep max|a| = 127 s, so a's scale stays s and its INT8 copy is q
    lam = (h[i] * (1 + 1e-2)) / (sgn * h).sum()
    a = s * q + lam * s * sgn
    rows = torch.stack([b, a]).to(torch.float32)
    return rows, h.to(torch.float32), 1, 0


def fp64_tie(H: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows (b, a) with z_a = z_b + 2^-60: float64 rounds them equal, only exact arithmetic orders them."""
    h = torch.zeros(H)
    h[0], h[1] = 1.0, 1.0
    b = torch.zeros(H)
    b[0] = 1.0
    a = b.clone()
    a[1] = 2.0**-60
    return torch.stack([b, a]), h


def embed_pair(rows: torch.Tensor, h: torch.Tensor, V: int, at: tuple[int, int], gen: torch.Generator):
    """A V-row head of small random rows with `rows` placed at indices `at` (the pair leads)."""
    H = h.numel()
    W = torch.randn(V, H, generator=gen) * (1e-3 * rows.abs().max())
    W[at[0]] = rows[0]
    W[at[1]] = rows[1]
    return W


def int8_ranks_wrong(W: torch.Tensor, h: torch.Tensor, a: int, b: int) -> bool:
    """Whether the INT8 approximation s q . h orders b above a while the exact logits order a above b."""
    qh = quantize_head(W[[a, b]])
    approx = (qh.q.to(torch.float64) * qh.scale.to(torch.float64)[:, None]) @ h.to(torch.float64)
    z, err = exact_logits(W[[a, b]], h[None])
    return bool(approx[1] > approx[0]) and bool(z[0, 0] - err[0, 0] > z[0, 1] + err[0, 1])


SMOLLM2_TEXT = (
    "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    '    """ Check if in given list of numbers, are any two numbers closer to each other than\n'
    '    given threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n    """\n'
    "    for i, a in enumerate(numbers):\n        for b in numbers[i + 1:]:\n"
    "            if abs(a - b) < threshold:\n                return True\n    return False\n\n"
    "The Treaty of Westphalia, signed in 1648, ended the Thirty Years' War and laid the groundwork "
    "for the modern system of sovereign states. Historians still debate how much it changed."
)


@functools.lru_cache(maxsize=1)
def smollm2_head_and_hidden() -> tuple[torch.Tensor, torch.Tensor]:
    """SmolLM2-135M-Instruct's tied embedding [49152, 576] and the final-norm hidden states of real
    text, from HF Transformers' LlamaForCausalLM over the converted folder (fetched on first use)."""
    transformers = pytest.importorskip("transformers")
    from specpilot.deployments.stock import import_refspec

    import_refspec()
    from refspec.weights import SMOLLM2, resolve_model

    folder = resolve_model(SMOLLM2)
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok(SMOLLM2_TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        hidden = model.model(ids).last_hidden_state[0]  # after the final RMSNorm
    W = model.lm_head.weight.detach().clone()
    assert torch.equal(W, model.model.embed_tokens.weight), "SmolLM2's head is its tied embedding"
    return W, hidden.contiguous()
