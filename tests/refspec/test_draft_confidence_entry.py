"""The draft-confidence entry (built-in refspec bundle): a shorter chain is still lossless.

The entry verifies the drafter's top-1 chain only while the product of its top-1 probabilities
stays >= decode.min_draft_prob. Fewer rows never change a committed token, so on real HumanEval
prompts the output is the AR output and each step verifies at most as many rows as stock's.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from refspec.generate import greedy as stock_greedy

from .conftest import humaneval_prompts
from .tree_entry import checkout_entry, import_tree

ENTRY = "refspec-draft-confidence"
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def dc(tmp_path_factory):
    """The entry's refspec package (imported as `refspec_draft_confidence`)."""
    return import_tree(
        checkout_entry(tmp_path_factory.mktemp("dc") / "tree", ENTRY), "refspec_draft_confidence"
    )


def test_entry_default_and_range(dc, tmp_path):
    assert dc.config.load_config().decode.min_draft_prob == 0.7
    bad = tmp_path / "refspec.toml"
    bad.write_text("[decode]\nmin_draft_prob = 1.5\n")
    with pytest.raises(dc.errors.RefspecError, match="min_draft_prob must be in"):
        dc.config.load_config(bad)


def test_confident_length(dc):
    lat = dc.drafter.Lattice(
        tokens=[[5], [6], [7], [8]], logp=[[math.log(0.9)], [math.log(0.9)], [math.log(0.5)], [0.0]]
    )
    assert lat.confident_length(0.85) == 1  # 0.9, then 0.81 < 0.85
    assert lat.confident_length(0.7) == 2  # 0.81, then 0.405
    assert lat.confident_length(0.4) == 4  # 0.405 and a certain last position
    assert dc.drafter.Lattice().confident_length(0.5) == 0


@pytest.mark.parametrize("min_prob", [0.3, 0.7])
def test_output_equals_ar_with_fewer_rows(dc, engine, model, min_prob):
    config = dc.config.load_config()
    config.decode = dataclasses.replace(config.decode, min_draft_prob=min_prob)
    eng = dc.generate.Engine(model, config)
    rows_entry = rows_stock = 0
    for prompt in humaneval_prompts(3):
        ar, _ = stock_greedy(engine, prompt, NEW_TOKENS, "ar")
        spec, stock = stock_greedy(engine, prompt, NEW_TOKENS, "spec")
        out, stats = dc.generate.greedy(eng, prompt, NEW_TOKENS, "spec")
        assert out == ar == spec, "a shorter chain changed a committed token"
        rows_entry, rows_stock = rows_entry + stats.rows, rows_stock + stock.rows
        assert stats.steps < NEW_TOKENS, "code prompts: confident drafts are still accepted"
    assert rows_entry < rows_stock
