"""The shared-budget entry (built-in refspec bundle): one node budget spent best-first across a
batch step's requests, lossless, and a copy of kernels/batching.py that does not drift."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from refspec.generate import greedy as stock_greedy

from tests.memory_store.test_tree_entry import definitions, imports

from .conftest import humaneval_prompts
from .tree_entry import batch_engine, checkout_entry, entry_model, import_tree

ENTRY = "refspec-shared-budget"
KERNEL = Path(__file__).resolve().parents[2] / "kernels" / "batching.py"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return checkout_entry(tmp_path_factory.mktemp("sb") / "tree", ENTRY)


@pytest.fixture(scope="module")
def sb(tree):
    """The entry's refspec package (imported as `refspec_shared_budget`)."""
    pkg = import_tree(tree, "refspec_shared_budget")
    for sub in ("runtime", "batch", "batching"):
        setattr(pkg, sub, importlib.import_module(f"refspec_shared_budget.{sub}"))
    return pkg


@pytest.fixture(scope="module")
def sb_model(sb, folder):
    return entry_model(sb, folder)


def test_copy_of_the_kernel_is_byte_identical(tree):
    """When this fails, kernels/batching.py changed the definition the entry carries: copy it into
    a new entry (entries are immutable)."""
    copy, kernel = (
        definitions((tree / "refspec" / "batching.py").read_text()),
        definitions(KERNEL.read_text()),
    )
    assert (
        set(copy) == {"shared_budget_trees"} and copy["shared_budget_trees"] == kernel["shared_budget_trees"]
    )
    assert imports((tree / "refspec" / "batching.py").read_text()) <= imports(KERNEL.read_text())


def test_entry_needs_the_tree_policy(sb, sb_model):
    with pytest.raises(sb.errors.RefspecError, match="enable it"):
        batch_engine(sb, sb_model, 2, tree={"enabled": False})


def test_one_request_gets_the_tree_policys_tree(sb, sb_model):
    eng = batch_engine(sb, sb_model, 1).engine
    lat = sb.drafter.Lattice(tokens=[[5, 6], [7, 8]], logp=[[-0.1, -1.0], [-0.2, -0.3]], cond=[{}, {}])
    eng.last = 3
    [shared] = eng.batch_policy.propose([eng], [lat], [100])
    alone = eng.policy.propose(eng, lat, 100)
    assert shared.tokens == alone.tokens and shared.depth == alone.depth
    assert (shared.mask == alone.mask).all()


def test_the_budget_goes_to_the_confident_request(sb, sb_model):
    """Two requests, 2 x 4 nodes: a sure drafter's request takes the nodes a guessing one would
    waste (8 nodes where equal trees give it 4)."""
    policy = batch_engine(sb, sb_model, 2, tree={"nodes": 4}).engine.batch_policy
    sure = sb.drafter.Lattice(tokens=[[t] for t in range(10, 18)], logp=[[-0.01]] * 8, cond=[{}] * 8)
    guess = sb.drafter.Lattice(tokens=[[20, 21], [22, 23]], logp=[[-2.0, -2.1], [-2.0, -2.2]], cond=[{}, {}])
    lanes = [type("L", (), {"last": 1})(), type("L", (), {"last": 2})()]
    a, b = policy.propose(lanes, [sure, guess], [100, 100])
    assert len(a.tokens) - 1 == 8 and len(b.tokens) == 1  # 8 sure nodes outrank every guess
    assert a.tokens[0] == 1 and b.tokens == [2]


def test_batch_outputs_equal_single_request_ar(sb, engine, sb_model):
    """Three lanes, five requests of different lengths: each output is its single-request AR output."""
    prompts, n = humaneval_prompts(5), [24, 16, 32, 8, 20]
    batch = batch_engine(sb, sb_model, 3)
    reqs = [
        sb.runtime.Request(id=i, input_ids=p, max_new_tokens=k)
        for i, (p, k) in enumerate(zip(prompts, n, strict=True))
    ]
    out: dict[int, list[int]] = {i: [] for i in range(5)}
    for ev in batch.generate(reqs, "spec"):
        if "tokens" in ev:
            out[ev["id"]].extend(ev["tokens"])
    for i, p in enumerate(prompts):
        assert out[i] == stock_greedy(engine, p, n[i], "ar")[0]
