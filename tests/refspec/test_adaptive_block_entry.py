"""The adaptive-block entry (built-in refspec bundle): a per-request chain cut from its recent
acceptance, lossless for one request and for many served together (batch.py)."""

from __future__ import annotations

import importlib

import pytest
import torch
from refspec.generate import greedy as stock_greedy

from .conftest import humaneval_prompts
from .tree_entry import checkout_entry, engine_for, import_tree

ENTRY = "refspec-adaptive-block"
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def ab(tmp_path_factory):
    """The entry's refspec package (imported as `refspec_adaptive_block`)."""
    pkg = import_tree(checkout_entry(tmp_path_factory.mktemp("ab") / "tree", ENTRY), "refspec_adaptive_block")
    for sub in ("runtime", "batch"):
        setattr(pkg, sub, importlib.import_module(f"refspec_adaptive_block.{sub}"))
    return pkg


@pytest.fixture(scope="module")
def mech(ab):
    return importlib.import_module("refspec_adaptive_block.ext.adaptive_block")


def test_entry_default_and_range(ab, model):
    config = ab.config.load_config()
    assert config.ext["adaptive_block"] == {"enabled": True, "decay": 0.5, "slack": 0}
    for bad, message in (
        ({"decay": 0.0}, r"decay must be in \(0, 1\]"),
        ({"slack": -1}, "slack must be at least 0"),
    ):
        with pytest.raises(ab.errors.RefspecError, match=message):
            engine_for(ab, model, adaptive_block=bad)


def test_block_for(mech):
    assert mech.block_for(8.0, 1, 8) == 8  # a fresh request: the full block
    assert mech.block_for(2.0, 1, 8) == 3 and mech.block_for(2.2, 1, 8) == 4
    assert mech.block_for(0.0, 0, 8) == 1  # always at least one draft row
    assert mech.block_for(7.5, 3, 8) == 8


def test_the_mean_follows_acceptance_and_restarts_per_request(ab, mech, model):
    eng = engine_for(ab, model)
    policy = eng.policy
    assert isinstance(policy, mech.AdaptiveChain)
    lat = ab.drafter.Lattice(tokens=[[t] for t in range(10, 18)], logp=[[-0.1]] * 8, cond=[{}] * 8)
    eng.stats, eng.last = ab.generate.Stats(), 5
    p = policy.propose(eng, lat, 100)
    assert len(p.tokens) == 9  # the full block at a request's first step
    committed, path = policy.accept(eng, p, [10, 99] + [0] * 7)  # one draft row accepted
    assert committed == [10, 99] and path == [1] and eng.adaptive_mean == pytest.approx(4.5)
    eng.stats.steps = 1
    assert len(policy.propose(eng, lat, 100).tokens) == 1 + 5  # ceil(4.5) + slack 0
    policy.accept(eng, ab.ext.Pass([5], [0]), [7])  # no draft rows: the mean stays
    assert eng.adaptive_mean == pytest.approx(4.5)
    eng.stats.steps = 0  # the next request starts at the full block again
    assert len(policy.propose(eng, lat, 100).tokens) == 9


def test_output_equals_ar_with_fewer_rows(ab, engine, model):
    eng = engine_for(ab, model, adaptive_block={"slack": 0})
    rows_entry = rows_stock = 0
    for prompt in humaneval_prompts(3):
        ar, _ = stock_greedy(engine, prompt, NEW_TOKENS, "ar")
        spec, stock = stock_greedy(engine, prompt, NEW_TOKENS, "spec")
        out, stats = ab.generate.greedy(eng, prompt, NEW_TOKENS, "spec")
        assert out == ar == spec, "a shorter chain changed a committed token"
        rows_entry, rows_stock = rows_entry + stats.rows, rows_stock + stock.rows
    assert rows_entry < rows_stock


def test_batch_serving_keeps_each_requests_output(ab, engine, folder):
    """Three lanes, five requests: each request's state lives on its lane and restarts with it."""
    config = ab.config.load_config()
    model = ab.model.load_model(folder, torch.device("cpu"), torch.float32, config.runtime.cpu_layout)
    batch = ab.batch.BatchEngine(ab.generate.Engine(model, config, ab.ext.load(config)), 3)
    prompts = humaneval_prompts(5)
    reqs = [ab.runtime.Request(id=i, input_ids=p, max_new_tokens=24) for i, p in enumerate(prompts)]
    out: dict[int, list[int]] = {i: [] for i in range(5)}
    for ev in batch.generate(reqs, "spec"):
        if "tokens" in ev:
            out[ev["id"]].extend(ev["tokens"])
    for i, p in enumerate(prompts):
        assert out[i] == stock_greedy(engine, p, 24, "ar")[0]
