"""The draft-confidence entry (built-in refspec bundle): a shorter chain is still lossless.

The entry cuts the drafter's lattice after the first position where the product of its top-1
probabilities falls below draft_confidence.min_prob. Fewer rows never change a committed token, so
on real HumanEval prompts the output is the AR output and each step verifies at most as many rows
as stock's.
"""

from __future__ import annotations

import math

import pytest
from refspec.generate import greedy as stock_greedy

from .conftest import humaneval_prompts
from .tree_entry import checkout_entry, engine_for, import_tree

ENTRY = "refspec-draft-confidence"
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def dc(tmp_path_factory):
    """The entry's refspec package (imported as `refspec_draft_confidence`)."""
    return import_tree(
        checkout_entry(tmp_path_factory.mktemp("dc") / "tree", ENTRY), "refspec_draft_confidence"
    )


def test_entry_default_and_range(dc, model):
    config = dc.config.load_config()
    assert config.ext["draft_confidence"] == {"enabled": True, "min_prob": 0.7}
    for bad in (1.5, 0.0):
        with pytest.raises(dc.errors.RefspecError, match=r"min_prob must be in \(0, 1\)"):
            engine_for(dc, model, draft_confidence={"min_prob": bad})


def test_confident_length(dc):
    from importlib import import_module

    mech = import_module("refspec_draft_confidence.ext.draft_confidence")
    lat = dc.drafter.Lattice(
        tokens=[[5], [6], [7], [8]], logp=[[math.log(0.9)], [math.log(0.9)], [math.log(0.5)], [0.0]]
    )
    assert mech.confident_length(lat, 0.85) == 1  # 0.9, then 0.81 < 0.85
    assert mech.confident_length(lat, 0.7) == 2  # 0.81, then 0.405
    assert mech.confident_length(lat, 0.4) == 4  # 0.405 and a certain last position
    assert mech.confident_length(dc.drafter.Lattice(), 0.5) == 0
    assert mech.cut(lat, mech.Knobs(True, 0.7)).tokens == [[5], [6]]


@pytest.mark.parametrize("min_prob", [0.3, 0.7])
def test_output_equals_ar_with_fewer_rows(dc, engine, model, min_prob):
    eng = engine_for(dc, model, draft_confidence={"min_prob": min_prob})
    rows_entry = rows_stock = 0
    for prompt in humaneval_prompts(3):
        ar, _ = stock_greedy(engine, prompt, NEW_TOKENS, "ar")
        spec, stock = stock_greedy(engine, prompt, NEW_TOKENS, "spec")
        out, stats = dc.generate.greedy(eng, prompt, NEW_TOKENS, "spec")
        assert out == ar == spec, "a shorter chain changed a committed token"
        rows_entry, rows_stock = rows_entry + stats.rows, rows_stock + stock.rows
        assert stats.steps < NEW_TOKENS, "code prompts: confident drafts are still accepted"
    assert rows_entry < rows_stock
