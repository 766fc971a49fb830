"""The model against HF Transformers on the same folder, and the cache/mask/position contract."""

from __future__ import annotations

import pytest
import torch
from refspec.model import load_model
from transformers import LlamaForCausalLM

from .conftest import humaneval_prompts

# fp32 through 30 layers: HF itself is ~7e-5 off a float64 run on these prompts, refspec ~1e-4
# (oneDNN sums in another order than MKL); 1e-3 on logits of magnitude ~30 is fp32 agreement.
ATOL = 1e-3


@pytest.fixture(scope="module")
def hf(folder):
    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    """A real HumanEval prompt (chat-templated), cut to 96 tokens to keep the passes short."""
    return torch.tensor([humaneval_prompts(1)[0][:96]])


def full_forward(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits of a whole sequence in one causal pass from slot 0."""
    n = ids.shape[1]
    model.setup_cache(1, n + 16)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    return model.forward(ids, torch.arange(n), 0, mask, n)


@pytest.mark.parametrize("layout", ["plain", "dual"])
def test_logits_equal_hf_transformers(folder, hf, ids, layout):
    model = load_model(folder, torch.device("cpu"), torch.float32, layout)
    ours = full_forward(model, ids)
    with torch.no_grad():
        ref = hf(ids).logits
    diff = (ours - ref).abs().max().item()
    assert diff < ATOL, f"max |logit diff| {diff:.2e} vs HF ({layout})"
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_cached_chain_rows_equal_full_forward(model, ids):
    """Prefill, then verify 5 rows against the cache: the logits of one full pass."""
    ref = full_forward(model, ids)
    n, p = ids.shape[1], ids.shape[1] - 5
    full_forward(model, ids[:, :p])
    mask = torch.ones(5, n, dtype=torch.bool)
    mask[:, p:] = torch.ones(5, 5, dtype=torch.bool).tril()
    out = model.forward(ids[:, p:], torch.arange(p, n), p, mask, n)
    assert (out - ref[:, p:]).abs().max().item() < ATOL
    # One more row alone (mask None = attend to every slot up to kv_len), after a rollback of 2.
    out = model.forward(ids[:, p + 2 : p + 3], torch.tensor([p + 2]), p + 2, None, p + 3)
    assert (out - ref[:, p + 2 : p + 3]).abs().max().item() < ATOL


def test_tree_rows_with_explicit_mask_and_positions(model, ids, tokenizer):
    """Two branches verified in one pass (slots != positions) equal each branch's own full pass."""
    p = ids.shape[1]
    a = tokenizer.encode(" return any(abs").ids[:3]
    b = tokenizer.encode(" for i in range").ids[:3]
    branch_a = full_forward(model, torch.cat([ids, torch.tensor([a])], 1))[:, p:]
    branch_b = full_forward(model, torch.cat([ids, torch.tensor([b])], 1))[:, p:]
    full_forward(model, ids)  # the prefix in slots 0..p-1
    # Nodes a0 a1 a2 b0 b1 b2 at slots p..p+5; depths 0,1,2 for each branch.
    rows = torch.tensor([a + b])
    positions = torch.tensor([p, p + 1, p + 2, p, p + 1, p + 2])
    mask = torch.zeros(6, p + 6, dtype=torch.bool)
    mask[:, :p] = True
    for r in range(6):
        first = 0 if r < 3 else 3
        mask[r, p + first : p + r + 1] = True
    out = model.forward(rows, positions, torch.arange(p, p + 6), mask, p + 6)
    assert (out[:, :3] - branch_a).abs().max().item() < ATOL
    assert (out[:, 3:] - branch_b).abs().max().item() < ATOL
