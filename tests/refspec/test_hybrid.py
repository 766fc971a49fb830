"""refspec's hybrid target (GDN + attention, 3:1, random weights): stock chain verification with
per-row GDN snapshots keeps the output equal to AR; a tree pass is refused without a GDN tree
mechanism; the engine serves a hybrid folder (config.json only)."""

from __future__ import annotations

import json

import pytest
import torch
from refspec.config import Config
from refspec.errors import RefspecError
from refspec.generate import Engine, greedy
from refspec.hybrid import HybridArgs, HybridModel, gdn_chain, random_state
from refspec.runtime import open_engine

ARGS = HybridArgs(vocab=64, layers=8)  # layers 3 and 7 attention, the rest GDN
# A prompt that repeats: the n-gram drafter finds matches, so spec steps verify multi-row chains.
PROMPT = [5, 9, 17, 3, 22, 9, 17, 3, 41, 5, 9, 17, 3, 22, 9, 17, 3, 41, 5, 9] * 2


def engine(seed: int = 0) -> Engine:
    return Engine(HybridModel(ARGS, random_state(ARGS, seed), torch.device("cpu"), torch.float32), Config())


def test_spec_output_is_ar_output_with_per_row_snapshots():
    for seed in range(3):
        e = engine(seed)
        ar, _ = greedy(e, PROMPT, 48, mode="ar")
        spec, stats = greedy(e, PROMPT, 48, mode="spec")
        assert spec == ar, seed
        assert stats.steps < 48  # drafts were accepted: rows past row 0 were kept from snapshots


def test_gdn_state_after_a_request_is_the_chain_over_every_committed_token():
    e = engine()
    greedy(e, PROMPT, 12, mode="spec")
    m = e.model
    context = e.drafter.context  # every committed token (the last step's may run past the 12 asked)
    # Re-run the whole context as one chain through a fresh model: its states must be the states
    # the engine settled, step by step, from snapshots (the last committed token excluded).
    fresh = HybridModel(ARGS, random_state(ARGS, 0), torch.device("cpu"), torch.float32)
    fresh.setup_cache(1, len(context) + 16)
    fresh.prefill(context[:-1], 0)
    m._settle(e.pos)
    # Not bit for bit: the projections of one many-row prefill round differently from step-sized
    # passes. A wrong snapshot (one row off) is far outside this tolerance.
    assert torch.allclose(m.state, fresh.state, rtol=1e-4, atol=1e-6)
    fresh.setup_cache(1, len(context) + 16)
    fresh.prefill(context[:-2], 0)
    assert not torch.allclose(m.state, fresh.state, rtol=1e-2, atol=1e-4)


def test_a_tree_pass_needs_a_gdn_tree_mechanism():
    e = engine()
    e.model.setup_cache(1, 64)
    e.model.prefill(PROMPT[:-1], 0)
    mask = [[True, False, False], [True, True, False], [True, False, True]]  # two children of the root
    with pytest.raises(RefspecError, match="verifies chains only.*GDN tree"):
        e.model.verify(
            [PROMPT[-1], 9, 17], [len(PROMPT) - 1, len(PROMPT), len(PROMPT)], len(PROMPT) - 1, mask
        )


def test_gdn_chain_is_the_delta_rule():
    gen = torch.Generator().manual_seed(0)
    s0 = torch.randn(2, 4, 3, generator=gen)
    q, k = torch.randn(5, 2, 4, generator=gen), torch.randn(5, 2, 4, generator=gen)
    v, g, beta = (
        torch.randn(5, 2, 3, generator=gen),
        -torch.rand(5, 2, generator=gen),
        torch.rand(5, 2, generator=gen),
    )
    o, snaps = gdn_chain(s0, q, k, v, g, beta)
    s = s0.clone()
    for t in range(5):
        for h in range(2):  # one head at a time, by the formulas: S <- e^g S; u = b (v - S^T k); S += k u^T
            sh = torch.exp(g[t, h]) * s[h]
            u = beta[t, h] * (v[t, h] - sh.T @ k[t, h])
            s[h] = sh + torch.outer(k[t, h], u)
            assert torch.allclose(o[t, h], s[h].T @ q[t, h], atol=1e-6)
        assert torch.allclose(snaps[t], s, atol=1e-6)


def test_open_engine_serves_a_hybrid_folder(tmp_path):
    cfg = {"model_type": "refspec_hybrid", "seed": 1, "vocab": 64, "layers": 4}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    e = open_engine("cpu:0", str(tmp_path), None, Config())
    assert isinstance(e.model, HybridModel) and e.model.args.layers == 4
    ar, _ = greedy(e, PROMPT, 16, mode="ar")
    spec, _ = greedy(e, PROMPT, 16, mode="spec")
    assert spec == ar
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"gdn_heads": 3}))
    with pytest.raises(RefspecError, match="unknown hybrid model keys \\['gdn_heads'\\]"):
        open_engine("cpu:0", str(tmp_path), None, Config())
