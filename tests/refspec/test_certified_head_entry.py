"""The certified-head entry (built-in refspec bundle): the INT8 LM head never changes an argmax.

The entry carries refspec/certified_head.py (the CPU path of kernels/certified_head, condensed)
and takes the target's argmax from it when decode.lm_head = "certified". The certificate is
checked against SpecPilot's own exact head (`specpilot.kernels.certified_head.exact_argmax`, a
separate implementation): on adversarial near-ties that the INT8 copy ranks wrongly, and on every
verify pass of real SmolLM2 decoding of HumanEval prompts, where the output must equal stock's.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from refspec.generate import greedy as stock_greedy

from specpilot.kernels.certified_head import exact_argmax, exact_logits
from tests.kernels.certhead_cases import (
    embed_pair,
    fp64_tie,
    hostile_head,
    hostile_hidden,
    int8_ranks_wrong,
    near_tie_int8_wrong,
    realistic_head,
    realistic_hidden,
)

from .conftest import humaneval_prompts
from .tree_entry import checkout_entry, import_tree

ENTRY = "refspec-certified-head"
NEW_TOKENS = 40
METHODS = ["dequant"] + (["int8pack"] if hasattr(torch.ops.aten, "_weight_int8pack_mm") else [])


@pytest.fixture(scope="module")
def ch(tmp_path_factory):
    """The entry's refspec package (imported as `refspec_certified_head`)."""
    return import_tree(
        checkout_entry(tmp_path_factory.mktemp("ch") / "tree", ENTRY), "refspec_certified_head"
    )


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_knob_default_and_range(ch, tmp_path):
    assert ch.config.load_config().decode.lm_head == "certified"
    bad = tmp_path / "refspec.toml"
    bad.write_text('[decode]\nlm_head = "int8"\n')
    with pytest.raises(
        ch.errors.RefspecError, match=r"refspec\.toml: decode\.lm_head = 'int8'; use one of exact"
    ):
        ch.config.load_config(bad)


@pytest.mark.parametrize("method", METHODS)
def test_near_ties_the_int8_copy_ranks_wrongly(ch, method):
    """The INT8 copy prefers the loser by a hair; the certificate keeps both, rescoring picks right."""
    gen = _gen(11)
    for trial in range(3):
        rows, h, _, _ = near_tie_int8_wrong(256 + 64 * trial, gen)
        a, b = 3000 - 7 * trial, 20 + trial  # the exact winner a has the larger index
        W = embed_pair(rows, h, 4000, at=(b, a), gen=gen)
        assert int8_ranks_wrong(W, h, a, b), "the construction must make INT8 prefer the loser"
        head = ch.certified_head.CertifiedHead(W, method)
        lower, upper = head.bounds(h[None])
        assert float(upper[0, b]) > float(lower[0, a]), "b must survive: the bounds cannot separate them"
        # Beside ordinary rows, in one call (one shared rescoring pass).
        batch = torch.cat([h[None], realistic_hidden(W, 4, gen)])
        assert head.argmax(batch) == exact_argmax(W, batch).tolist()
        assert head.argmax(batch)[0] == a and head.survivors[0] >= 2


def test_float64_ties_and_exact_ties(ch):
    gen = _gen(12)
    rows, h = fp64_tie(64)
    W = embed_pair(rows, h, 500, at=(3, 400), gen=gen)
    z, _ = exact_logits(W[[3, 400]], h[None])
    assert float(z[0, 0]) == float(z[0, 1]), "float64 alone cannot order this pair"
    assert ch.certified_head.CertifiedHead(W).argmax(h[None]) == [400]
    W2 = torch.randn(800, 64, generator=gen) * 0.01
    W2[77] = W2[650] = torch.randn(64, generator=gen)  # an exact tie: the smallest index, as torch.argmax
    assert ch.certified_head.CertifiedHead(W2).argmax(W2[77][None] * 3) == [77]


@pytest.mark.parametrize("method", METHODS)
def test_bounds_hold_on_hostile_rows(ch, method):
    gen = _gen(13)
    for W, h in (
        (hostile_head(700, 96, gen), hostile_hidden(7, 96, gen)),
        (realistic_head(900, 128, gen, torch.bfloat16), None),
    ):
        h = realistic_hidden(W, 7, gen) if h is None else h
        head = ch.certified_head.CertifiedHead(W, method)
        lower, upper = head.bounds(h)
        z, err = exact_logits(W, h)
        assert bool((lower.double() <= z - err).all()) and bool((upper.double() >= z + err).all())
        assert head.argmax(h) == exact_argmax(W, h).tolist()


def test_non_finite_row_takes_the_plain_head(ch):
    gen = _gen(14)
    W = realistic_head(600, 64, gen)
    h = realistic_hidden(W, 3, gen)
    h[1, 5] = float("nan")
    head = ch.certified_head.CertifiedHead(W)
    out = head.argmax(h)
    assert out[1] == int(torch.nn.functional.linear(h[1:2], W).argmax()) and head.survivors[1] == 0
    assert [out[0], out[2]] == exact_argmax(W, h[[0, 2]]).tolist() and min(head.survivors[0::2]) >= 1
    W[3, 3] = float("inf")
    with pytest.raises(ch.errors.RefspecError, match="inf or NaN"):
        ch.certified_head.CertifiedHead(W)


@pytest.fixture(scope="module")
def entry_model(ch, folder):
    """SmolLM2 through the entry's model.py (its forward can stop before the head)."""
    layout = ch.config.load_config().runtime.cpu_layout
    return ch.model.load_model(folder, torch.device("cpu"), torch.float32, layout)


def test_output_equals_stock_and_every_argmax_is_exact(ch, entry_model, engine, model):
    """Real HumanEval prompts: certified spec and AR decode stock's AR tokens, and every verify
    row's argmax equals the exact head's and the fp32 head's on the same hidden states."""
    eng = ch.generate.Engine(entry_model, ch.config.load_config())
    assert eng.head is not None
    seen: list[tuple[torch.Tensor, list[int], list[int]]] = []
    certified = eng.head.argmax

    def spy(hidden: torch.Tensor) -> list[int]:  # records what the real head was asked and said
        out = certified(hidden)
        seen.append((hidden.clone(), out, list(eng.head.survivors)))
        return out

    eng.head.argmax = spy
    for prompt in humaneval_prompts(3):
        ar, _ = stock_greedy(engine, prompt, NEW_TOKENS, "ar")
        spec, stats = ch.generate.greedy(eng, prompt, NEW_TOKENS, "spec")
        assert spec == ar, "the certified head changed a committed token"
        assert stats.steps < NEW_TOKENS, "code prompts: drafts are accepted"
    ar_cert, _ = ch.generate.greedy(eng, prompt, NEW_TOKENS, "ar")
    assert ar_cert == ar
    hidden = torch.cat([h for h, _, _ in seen])
    got = [v for _, out, _ in seen for v in out]
    assert got == exact_argmax(model.embed, hidden).tolist()
    # The fp32 head stock's verify would run on the same rows (same call shapes, same kernels).
    fp32 = [v for h, _, _ in seen for v in model.lm_head(h).argmax(-1).tolist()]
    assert got == fp32
    survivors = torch.tensor([n for _, _, ns in seen for n in ns], dtype=torch.float64)
    assert len(got) > 3 * NEW_TOKENS, "spec passes verify several rows"
    assert float(survivors.median()) <= 16, "the certificate is tight on real states (49,152 tokens)"

    # lm_head = "exact" is stock's code path.
    exact = ch.config.load_config()
    exact.decode = dataclasses.replace(exact.decode, lm_head="exact")
    plain = ch.generate.Engine(entry_model, exact)
    assert plain.head is None
    assert ch.generate.greedy(plain, prompt, NEW_TOKENS, "spec")[0] == ar
