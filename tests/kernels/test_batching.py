"""The shared node budget across a batch (paper §4.4): property tests against best_first_tree."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.kernels.batching import shared_budget_trees
from specpilot.kernels.tree import ROOT, best_first_tree

from .test_tree import lattices

ALL = 10_000  # more nodes than any generated candidate tree holds


def shape(tree) -> tuple:
    return tree.tokens, tree.parents, tree.depths, tree.scores


@settings(max_examples=150, deadline=None)
@given(lattices(), st.integers(0, 12))
def test_one_request_is_best_first(lat, n):
    assert shape(shared_budget_trees([lat], n)[0]) == shape(best_first_tree(lat, n))


@settings(max_examples=150, deadline=None)
@given(st.lists(lattices(), min_size=1, max_size=4), st.integers(0, 20))
def test_the_budget_goes_to_the_highest_path_scores_across_requests(lats, total):
    trees = shared_budget_trees(lats, total)
    full = [best_first_tree(lat, ALL) for lat in lats]  # every candidate node of every request
    assert sum(len(t) for t in trees) == min(total, sum(len(f) for f in full))
    chosen = sorted((s for t in trees for s in t.scores), reverse=True)
    best = sorted((s for f in full for s in f.scores), reverse=True)[: len(chosen)]
    assert chosen == best  # the top scores of the union, ties aside
    for lat, tree in zip(lats, trees, strict=True):
        # each request's part is its own best-first tree of that size: prefix-closed, parents first
        assert shape(tree) == shape(best_first_tree(lat, len(tree)))
        assert all(p == ROOT or p < i for i, p in enumerate(tree.parents))


def test_a_negative_budget_is_one_clear_error():
    with pytest.raises(ValueError, match="node budget must be >= 0"):
        shared_budget_trees([{"tokens": [[1]], "logp": [[0.0]]}], -1)
