"""The certified head on SmolLM2-135M's real tied embedding and real final hidden states (CPU)."""

from __future__ import annotations

import pytest
import torch

from specpilot.kernels.certified_head import CertifiedHead, certified_argmax, exact_argmax, exact_logits
from specpilot.kernels.certified_head.cpu import int8pack_available

from .certhead_cases import smollm2_head_and_hidden

METHODS = ["dequant"] + (["int8pack"] if int8pack_available() else [])


@pytest.fixture(scope="module")
def smollm2():
    W, hidden = smollm2_head_and_hidden()
    return W, hidden, exact_argmax(W, hidden)


@pytest.mark.parametrize("method", METHODS)
def test_argmax_identical_on_real_hidden_states(smollm2, method):
    W, hidden, ref = smollm2
    head = CertifiedHead(W, cpu_method=method)
    arg, n = certified_argmax(head, hidden)
    assert torch.equal(arg, ref)
    # The bound is tight enough to matter on real states: a handful of survivors out of 49,152.
    assert float(n.double().median()) <= 8
    assert int(n.max()) <= 400


def test_bounds_hold_on_real_hidden_states(smollm2):
    W, hidden, _ = smollm2
    h = hidden[::8]
    for method in METHODS:
        lower, upper = CertifiedHead(W, cpu_method=method).bounds(h)
        z, err = exact_logits(W, h)
        assert bool((lower.double() <= z - err).all()) and bool((upper.double() >= z + err).all())


def test_verify_step_shape(smollm2):
    """A verify step hands [rows, H] final hidden states; the result replaces logits.argmax(-1)."""
    W, hidden, ref = smollm2
    rows = hidden[:9].reshape(1, 9, -1)  # one request, 8 draft positions + the bonus row
    arg, n = certified_argmax(CertifiedHead(W), rows)
    assert arg.shape == (1, 9) and n.shape == (1, 9)
    assert torch.equal(arg[0], ref[:9])
