"""Certified INT8 LM head on the CPU (torch path): sound bounds, argmax identical to the exact head."""

from __future__ import annotations

import pytest
import torch

from specpilot.kernels.certified_head import (
    CertifiedHead,
    certified_argmax,
    exact_argmax,
    exact_logits,
    quantize_head,
    split_hidden,
)
from specpilot.kernels.certified_head.cpu import int8pack_available

from .certhead_cases import (
    embed_pair,
    fp64_tie,
    hostile_head,
    hostile_hidden,
    int8_ranks_wrong,
    near_tie_int8_wrong,
    realistic_head,
    realistic_hidden,
)

METHODS = ["dequant"] + (["int8pack"] if int8pack_available() else [])


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _assert_sound(head: CertifiedHead, W: torch.Tensor, h: torch.Tensor) -> None:
    lower, upper = head.bounds(h)
    z, err = exact_logits(W, h)
    # The real logit lies in [z - err, z + err]; the bounds must contain that whole interval.
    assert bool((lower.double() <= z - err).all()), "a lower bound exceeds an exact logit"
    assert bool((upper.double() >= z + err).all()), "an upper bound is below an exact logit"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantization_is_int8_with_certified_error_norms(dtype):
    W = hostile_head(301, 200, _gen(1)).to(dtype)
    qh = quantize_head(W)
    assert qh.q.dtype == torch.int8 and int(qh.q.abs().max()) <= 127
    assert bool((qh.scale > 0).all())
    assert torch.equal(qh.scale.to(torch.bfloat16).to(torch.float32), qh.scale), (
        "scales must be exact in bf16"
    )
    deq = qh.q.double() * qh.scale.double()[:, None]
    assert bool(((W.double() - deq).norm(dim=1) <= qh.err_norm.double()).all())
    assert bool((deq.norm(dim=1) <= qh.deq_norm.double()).all())
    # Not vacuous: the error of a Gaussian row is about 1% of its norm.
    g = quantize_head(torch.randn(64, 512, generator=_gen(2)))
    assert float((g.err_norm / g.deq_norm).max()) < 0.03


def test_hidden_split_is_exact():
    h = hostile_hidden(9, 333, _gen(3))
    sp = split_hidden(h)
    recon = sp.t1.double()[:, None] * sp.p1.double() + sp.t2.double()[:, None] * sp.p2.double()
    assert bool(((h.double() - recon).norm(dim=1) <= sp.r_norm.double()).all())
    assert bool((h.double().norm(dim=1) <= sp.h_norm.double()).all())
    assert float((sp.r_norm / sp.h_norm).max()) < 1e-3  # two limbs leave ~2^-16 of the norm


@pytest.mark.parametrize("method", METHODS)
def test_bounds_never_violated(method):
    gen = _gen(4)
    for trial in range(6):
        W = hostile_head(700 + trial, 96 + 40 * trial, gen) if trial % 2 else realistic_head(900, 128, gen)
        h = hostile_hidden(7, W.shape[1], gen) if trial % 3 else realistic_hidden(W, 7, gen)
        _assert_sound(CertifiedHead(W, cpu_method=method), W, h)


@pytest.mark.parametrize("method", METHODS)
def test_argmax_identical_on_random_inputs(method):
    gen = _gen(5)
    for trial in range(4):
        W = realistic_head(3000, 256, gen, dtype=torch.bfloat16 if trial % 2 else torch.float32)
        head = CertifiedHead(W, cpu_method=method)
        for h in (realistic_hidden(W, 9, gen), torch.randn(5, 256, generator=gen).to(W.dtype)):
            res = head.argmax(h)
            assert torch.equal(res.argmax, exact_argmax(W, h))
            assert bool((res.n_survivors >= 1).all())
    # Hostile rows and hidden states too.
    W = hostile_head(2000, 150, gen)
    h = hostile_hidden(6, 150, gen)
    assert torch.equal(CertifiedHead(W, cpu_method=method).argmax(h).argmax, exact_argmax(W, h))


def test_rescoring_fixes_int8_ranking_near_tie():
    gen = _gen(6)
    rows, h, _, _ = near_tie_int8_wrong(256, gen)
    W = embed_pair(rows, h, 4000, at=(10, 2000), gen=gen)  # b at 10, a (the exact winner) at 2000
    assert int8_ranks_wrong(W, h, 2000, 10), "the construction must make INT8 prefer the loser"
    for method in METHODS:
        res = CertifiedHead(W, cpu_method=method).argmax(h[None], return_logits=True)
        assert int(res.argmax[0]) == 2000 == int(exact_argmax(W, h[None])[0])
        assert {10, 2000} <= set(res.survivors[0].tolist())


def test_float64_tie_resolved_exactly_and_exact_ties_take_smallest_index():
    gen = _gen(7)
    rows, h = fp64_tie(64)
    W = embed_pair(rows, h, 500, at=(3, 400), gen=gen)
    z, _ = exact_logits(W[[3, 400]], h[None])
    assert float(z[0, 0]) == float(z[0, 1]), "float64 alone cannot order this pair"
    assert int(CertifiedHead(W).argmax(h[None]).argmax[0]) == 400 == int(exact_argmax(W, h[None])[0])
    # Exact tie (duplicate rows): the smallest index, as torch.argmax does.
    W2 = torch.randn(800, 64, generator=gen) * 0.01
    W2[77] = W2[650] = torch.randn(64, generator=gen)
    h2 = W2[77] * 3
    assert int(CertifiedHead(W2).argmax(h2[None]).argmax[0]) == 77 == int(exact_argmax(W2, h2[None])[0])


def test_shapes_logits_and_drop_in_function():
    gen = _gen(8)
    W = realistic_head(1500, 128, gen)
    h = realistic_hidden(W, 6, gen).reshape(2, 3, 128)
    head = CertifiedHead(W)
    arg, n = certified_argmax(head, h)
    assert arg.shape == n.shape == (2, 3)
    assert torch.equal(arg.flatten(), exact_argmax(W, h.reshape(-1, 128)))
    res = head.argmax(h, return_logits=True)
    for m, (rows, logits) in enumerate(zip(res.survivors, res.logits, strict=True)):
        z, err = exact_logits(W, h.reshape(-1, 128)[m : m + 1], rows)
        # float64 values of the exact logits: equal up to their rounding bound, whatever the GEMM shape.
        assert bool(((logits - z[0]).abs() <= 2 * err[0]).all())
        assert int(rows[logits.argmax()]) == int(arg.flatten()[m])


def test_bad_inputs_are_clear_errors():
    W = torch.randn(100, 32)
    head = CertifiedHead(W)
    with pytest.raises(ValueError, match="expects 32"):
        head.argmax(torch.randn(2, 31))
    bad = torch.randn(2, 32)
    bad[1, 3] = float("nan")
    with pytest.raises(ValueError, match="inf or NaN"):
        head.argmax(bad)
    W[4, 4] = float("inf")
    with pytest.raises(ValueError, match="inf or NaN"):
        CertifiedHead(W)
    with pytest.raises(ValueError, match="unknown backend"):
        CertifiedHead(torch.randn(10, 8), backend="cuda")
    with pytest.raises(ValueError, match="not supported"):
        CertifiedHead(torch.randn(10, 8, dtype=torch.float64))


@pytest.mark.parametrize("method", METHODS)
def test_float32_overflow_widens_bounds_and_never_drops_the_argmax(method):
    gen = _gen(9)
    W = torch.randn(400, 64, generator=gen)
    h = torch.randn(3, 64, generator=gen) * 3e37  # logits beyond float32: the approximate pass overflows
    head = CertifiedHead(W, cpu_method=method)
    lower, upper = head.bounds(h)
    assert not bool(torch.isnan(lower).any() or torch.isnan(upper).any())
    assert bool(torch.isinf(upper).any())
    assert torch.equal(head.argmax(h).argmax, exact_argmax(W, h))
