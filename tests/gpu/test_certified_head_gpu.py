"""Certified INT8 LM head on CUDA (Triton kernels compiled for the GPU). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from specpilot.kernels.certified_head import CertifiedHead, exact_argmax, exact_logits  # noqa: E402

from ..kernels.certhead_cases import (  # noqa: E402
    embed_pair,
    fp64_tie,
    hostile_head,
    hostile_hidden,
    int8_ranks_wrong,
    near_tie_int8_wrong,
    realistic_head,
    realistic_hidden,
)

H = 5120


def _sound(head, W, h) -> bool:
    lower, upper = head.bounds(h)
    z, err = exact_logits(W, h)
    return bool((lower.double() <= z - err).all() and (upper.double() >= z + err).all())


@pytest.mark.parametrize("M", [1, 8, 33, 64])
def test_argmax_identical_and_bounds_sound(M):
    gen = torch.Generator(device="cuda").manual_seed(M)
    W = realistic_head(40000, H, gen, torch.bfloat16)
    head = CertifiedHead(W)
    for h in (realistic_hidden(W, M, gen), hostile_hidden(M, H, gen).to(torch.bfloat16)):
        ref = exact_argmax(W, h)
        assert torch.equal(head.argmax(h).argmax, ref)
        res = head.argmax(h, use_graph=True)
        assert torch.equal(res.argmax, ref) and torch.equal(res.host_argmax, ref.cpu())
        assert _sound(head, W, h)


def test_a_row_past_its_survivor_slots_is_resolved_exactly():
    """Eight slots for isotropic hidden states (hundreds of survivors): every row overflows and
    goes to the exact fallback; the device argmax and the host copy both come back right."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    W = realistic_head(30000, H, gen, torch.bfloat16)
    h = (torch.randn(4, H, generator=gen, device="cuda") * 0.01).to(torch.bfloat16)
    res = CertifiedHead(W, cap=8).argmax(h, use_graph=True)
    ref = exact_argmax(W, h)
    assert bool((res.n_survivors > 8).all()), res.n_survivors
    assert torch.equal(res.argmax, ref) and torch.equal(res.host_argmax, ref.cpu())


def test_hostile_rows_and_adversarial_near_ties():
    gen = torch.Generator(device="cuda").manual_seed(7)
    Wh = hostile_head(9000, H, gen)
    hh = hostile_hidden(10, H, gen)
    head = CertifiedHead(Wh)
    assert _sound(head, Wh, hh)
    assert torch.equal(head.argmax(hh).argmax, exact_argmax(Wh, hh))
    cpu = torch.Generator().manual_seed(8)
    rows, h, _, _ = near_tie_int8_wrong(H, cpu)
    W = embed_pair(rows, h, 20000, at=(10, 15000), gen=cpu)
    assert int8_ranks_wrong(W, h, 15000, 10)
    assert int(CertifiedHead(W.cuda()).argmax(h[None].cuda()).argmax[0]) == 15000
    rows, h = fp64_tie(H)
    W = embed_pair(rows, h, 20000, at=(3, 12000), gen=cpu).cuda()
    assert int(CertifiedHead(W).argmax(h[None].cuda()).argmax[0]) == 12000
