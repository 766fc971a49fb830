"""The certified-head entry (built-in refspec bundle): the INT8 LM head never changes an argmax.

The entry carries refspec/certified_head/ (a byte-identical copy of SpecPilot's
kernels/certified_head/, whose own tests cover near-ties, float64 ties and hostile rows; the copy
is checked in tests/memory_store/test_tree_entry.py) and its mechanism refspec/ext/certified_head.py,
which replaces the LM head's argmax. Here it runs on real SmolLM2 decoding of HumanEval prompts:
the output must equal stock's AR and every verify row's argmax the exact head's (checked against
SpecPilot's `exact_argmax`, a separate implementation).
"""

from __future__ import annotations

import pytest
import torch
from refspec.generate import greedy as stock_greedy

from specpilot.kernels.certified_head import exact_argmax

from .conftest import humaneval_prompts
from .tree_entry import checkout_entry, engine_for, import_tree

ENTRY = "refspec-certified-head"
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def ch(tmp_path_factory):
    """The entry's refspec package (imported as `refspec_certified_head`)."""
    return import_tree(
        checkout_entry(tmp_path_factory.mktemp("ch") / "tree", ENTRY), "refspec_certified_head"
    )


def test_knob_default(ch, model):
    assert ch.config.load_config().ext["certified_head"] == {"enabled": True}
    assert engine_for(ch, model, certified_head={"enabled": False}).head is None


def test_non_finite_row_takes_the_plain_head(ch, model):
    head = engine_for(ch, model).head
    gen = torch.Generator().manual_seed(14)
    h = torch.randn(3, model.args.hidden, generator=gen)
    h[1, 5] = float("nan")
    out = head.argmax(h)
    assert out == torch.nn.functional.linear(h, head.weight).argmax(-1).tolist()
    assert head.argmax(h[[0, 2]]) == exact_argmax(head.weight, h[[0, 2]]).tolist()


def test_output_equals_stock_and_every_argmax_is_exact(ch, engine, model):
    """Real HumanEval prompts: certified spec and AR decode stock's AR tokens, and every verify
    row's argmax equals the exact head's and the fp32 head's on the same hidden states."""
    eng = engine_for(ch, model)
    seen: list[tuple[torch.Tensor, list[int]]] = []
    certified = eng.head.argmax

    def spy(hidden: torch.Tensor) -> list[int]:  # records what the real head was asked and said
        out = certified(hidden)
        seen.append((hidden.clone(), out))
        return out

    eng.head.argmax = spy
    for prompt in humaneval_prompts(3):
        ar, _ = stock_greedy(engine, prompt, NEW_TOKENS, "ar")
        spec, stats = ch.generate.greedy(eng, prompt, NEW_TOKENS, "spec")
        assert spec == ar, "the certified head changed a committed token"
        assert stats.steps < NEW_TOKENS, "code prompts: drafts are accepted"
    assert ch.generate.greedy(eng, prompt, NEW_TOKENS, "ar")[0] == ar
    hidden = torch.cat([h for h, _ in seen])
    got = [v for _, out in seen for v in out]
    assert got == exact_argmax(model.embed, hidden).tolist()
    # The fp32 head stock's verify runs on the same rows.
    assert got == [v for h, _ in seen for v in model.lm_head(h).argmax(-1).tolist()]
    assert len(got) > 3 * NEW_TOKENS, "spec passes verify several rows"
