"""The draft-tree builder (CONTRACTS §9): property tests against a brute-force candidate tree."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.kernels.tree import ROOT, Lattice, Tree, accept_length, best_first_tree, chain, topk_tree

VOCAB = 6


@st.composite
def lattices(draw, max_m: int = 4, max_k: int = 3, with_cond: bool = True) -> dict:
    """A lattice in the JSON form: distinct candidates per position, log-probs <= 0, optional cond."""
    m = draw(st.integers(1, max_m))
    logp_st = st.floats(-4.0, 0.0, allow_nan=False).map(lambda x: round(x, 3))
    tokens, logp = [], []
    for _ in range(m):
        row = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=max_k, unique=True))
        tokens.append(row)
        logp.append(sorted((draw(logp_st) for _ in row), reverse=True))
    cond: list[dict] = [{}]
    for _ in range(1, m):
        level = {}
        if with_cond:
            parents = draw(st.lists(st.integers(0, VOCAB - 1), max_size=3, unique=True))
            for p in parents:
                toks = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=max_k, unique=True))
                level[str(p)] = [[t, draw(logp_st)] for t in toks]
        cond.append(level)
    return {"tokens": tokens, "logp": logp, "cond": cond}


def edges(lat: dict, d: int, parent: int | None, conditioned: bool) -> list[tuple[int, float]]:
    """The contract's edge rule, written out independently of the module under test."""
    if d >= len(lat["tokens"]):
        return []
    if conditioned and parent is not None and str(parent) in lat["cond"][d]:
        return [(t, s) for t, s in lat["cond"][d][str(parent)]]
    return list(zip(lat["tokens"][d], lat["logp"][d], strict=True))


def all_nodes(lat: dict, conditioned: bool) -> list[tuple[tuple[int, ...], float]]:
    """Every node of the full candidate tree as (root path of tokens, path score)."""
    out: list[tuple[tuple[int, ...], float]] = []

    def walk(path: tuple[int, ...], score: float) -> None:
        parent = path[-1] if path else None
        for tok, lp in edges(lat, len(path), parent, conditioned):
            out.append((path + (tok,), score + lp))
            walk(path + (tok,), score + lp)

    walk((), 0.0)
    return out


def check_well_formed(tree: Tree) -> None:
    assert len(tree.tokens) == len(tree.parents) == len(tree.depths) == len(tree.scores)
    for i, p in enumerate(tree.parents):
        assert p == ROOT or 0 <= p < i, "every parent precedes its child"
        assert tree.depths[i] == (1 if p == ROOT else tree.depths[p] + 1)
    # Siblings are distinct tokens, so each root path names one node.
    paths = [tuple(tree.path(i)) for i in range(len(tree))]
    assert len(set(paths)) == len(paths)


@settings(max_examples=300, deadline=None)
@given(lat=lattices(), n=st.integers(0, 20), conditioned=st.booleans())
def test_best_first_keeps_the_top_n_prefix_closed_nodes(lat: dict, n: int, conditioned: bool) -> None:
    tree = best_first_tree(lat, n, conditioned=conditioned)
    check_well_formed(tree)
    full = dict(all_nodes(lat, conditioned))
    assert len(tree) == min(n, len(full)), "exactly n nodes when the candidate tree has them"
    kept = {tuple(tree.path(i)): tree.scores[i] for i in range(len(tree))}
    for path, score in kept.items():
        assert path in full and math.isclose(score, full[path], abs_tol=1e-9)
        assert path[:-1] == () or path[:-1] in kept, "prefix-closed"
    dropped = [s for p, s in full.items() if p not in kept]
    if kept and dropped:
        assert min(kept.values()) >= max(dropped) - 1e-9, "no dropped node outscores a kept one"


def prefix_closed_subsets(paths: list[tuple[int, ...]], n: int):
    for combo in itertools.combinations(paths, n):
        s = set(combo)
        if all(len(p) == 1 or p[:-1] in s for p in combo):
            yield combo


@settings(max_examples=150, deadline=None)
@given(lat=lattices(max_m=3, max_k=2), n=st.integers(1, 6), conditioned=st.booleans())
def test_best_first_maximizes_expected_accept_among_prefix_closed_trees(lat, n, conditioned) -> None:
    """Σ exp(path score) (expected accepted drafts under the drafter's own model) is maximal."""
    full = dict(all_nodes(lat, conditioned))
    n = min(n, len(full))
    best = max(sum(math.exp(full[p]) for p in c) for c in prefix_closed_subsets(list(full), n))
    tree = best_first_tree(lat, n, conditioned=conditioned)
    assert math.isclose(sum(math.exp(s) for s in tree.scores), best, rel_tol=1e-9)


@settings(max_examples=200, deadline=None)
@given(lat=lattices(with_cond=False), n=st.integers(0, 20))
def test_conditioned_equals_marginal_without_cond_entries(lat: dict, n: int) -> None:
    a, b = best_first_tree(lat, n, conditioned=True), best_first_tree(lat, n, conditioned=False)
    assert (a.tokens, a.parents, a.scores) == (b.tokens, b.parents, b.scores)


@settings(max_examples=200, deadline=None)
@given(lat=lattices(), n=st.integers(1, 20))
def test_conditioned_children_come_from_the_parents_cond_entry(lat: dict, n: int) -> None:
    tree = best_first_tree(lat, n, conditioned=True)
    for i, p in enumerate(tree.parents):
        if p == ROOT:
            continue
        entry = lat["cond"][tree.depths[i] - 1].get(str(tree.tokens[p]))
        if entry is not None:
            lp = dict((t, s) for t, s in entry)[tree.tokens[i]]
            assert math.isclose(tree.scores[i], tree.scores[p] + lp)


def test_conditioning_changes_the_tree_by_hand() -> None:
    # Marginally "b" is likely at position 1, but after "x" the drafter knows "y" follows.
    lat = {
        "tokens": [[10, 11], [20, 21]],
        "logp": [[math.log(0.6), math.log(0.4)], [math.log(0.5), math.log(0.5)]],
        "cond": [{}, {"10": [[21, math.log(0.9)]], "11": [[20, math.log(0.9)]]}],
    }
    cond = best_first_tree(lat, 3, conditioned=True)
    assert [cond.path(i) for i in range(3)] == [[10], [10, 21], [11]]
    marg = best_first_tree(lat, 3, conditioned=False)
    assert [marg.path(i) for i in range(3)] == [[10], [11], [10, 20]]
    # The target continues 10, 21: the conditioned tree accepts both, the marginal one only one.
    assert accept_length(cond, [10, 21, 5]) == 2
    assert accept_length(marg, [10, 21, 5]) == 1


@settings(max_examples=200, deadline=None)
@given(lat=lattices(with_cond=False), length=st.none() | st.integers(0, 6))
def test_chain_is_top1_per_position(lat: dict, length: int | None) -> None:
    tree = chain(lat, length)
    check_well_formed(tree)
    m = len(lat["tokens"]) if length is None else min(length, len(lat["tokens"]))
    assert tree.tokens == [row[0] for row in lat["tokens"][:m]]
    assert tree.parents == [ROOT] + list(range(m - 1)) if m else tree.parents == []
    assert tree.scores == pytest.approx(list(itertools.accumulate(r[0] for r in lat["logp"][:m])))


def test_empty_positions_end_the_lattice() -> None:
    lat = {"tokens": [[1, 2], [], [3]], "logp": [[-0.1, -1.0], [], [-0.2]], "cond": [{}, {}, {}]}
    assert chain(lat).tokens == [1]
    assert len(best_first_tree(lat, 10)) == 2
    assert len(best_first_tree({"tokens": [], "logp": [], "cond": []}, 8)) == 0


@settings(max_examples=200, deadline=None)
@given(lat=lattices(), k=st.integers(1, 4), depth=st.integers(1, 5), conditioned=st.booleans())
def test_topk_tree_shape(lat: dict, k: int, depth: int, conditioned: bool) -> None:
    tree = topk_tree(lat, k, depth, conditioned=conditioned)
    check_well_formed(tree)
    full = dict(all_nodes(lat, conditioned))
    per_depth = [tree.depths.count(d) for d in range(1, depth + 1)]
    assert all(c <= k for c in per_depth) and max(tree.depths, default=0) <= depth
    root = sorted(edges(lat, 0, None, conditioned), key=lambda e: -e[1])[:k]
    assert sorted(t for i, t in enumerate(tree.tokens) if tree.depths[i] == 1) == sorted(t for t, _ in root)
    for i in range(len(tree)):
        assert math.isclose(tree.scores[i], full[tuple(tree.path(i))], abs_tol=1e-9)
    # Layer l+1 holds the best-scoring children among each layer-l node's top-k children.
    for d in range(1, max(tree.depths, default=0)):
        layer = [i for i in range(len(tree)) if tree.depths[i] == d]
        pool = []
        for i in layer:
            kids = sorted(edges(lat, d, tree.tokens[i], conditioned), key=lambda e: -e[1])[:k]
            pool += [tree.scores[i] + lp for _, lp in kids]
        kept = sorted((tree.scores[i] for i in range(len(tree)) if tree.depths[i] == d + 1), reverse=True)
        assert kept == pytest.approx(sorted(pool, reverse=True)[: len(kept)])
        assert len(kept) == min(k, len(pool))


def test_topk_tree_by_hand() -> None:
    lat = {
        "tokens": [[1, 2, 3], [4, 5, 6]],
        "logp": [[-0.1, -0.5, -2.0], [-0.2, -0.3, -3.0]],
        "cond": [{}, {}],
    }
    tree = topk_tree(lat, 2, 2, conditioned=False)
    # Layer 2 candidates: 1->4 (-0.3), 1->5 (-0.4), 2->4 (-0.7), 2->5 (-0.8): keep the first two.
    assert [tree.path(i) for i in range(len(tree))] == [[1], [2], [1, 4], [1, 5]]


@settings(max_examples=300, deadline=None)
@given(lat=lattices(), n=st.integers(1, 20), target=st.lists(st.integers(0, VOCAB - 1), max_size=6))
def test_accept_length_is_the_longest_matching_root_path(lat: dict, n: int, target: list[int]) -> None:
    tree = best_first_tree(lat, n)
    want = max((len(p) for p in (tree.path(i) for i in range(len(tree))) if p == target[: len(p)]), default=0)
    assert accept_length(tree, target) == want


def test_accept_length_follows_repeated_sibling_tokens() -> None:
    tree = Tree()
    a = tree.add(7, ROOT, -0.1)
    tree.add(7, ROOT, -0.2)  # a second branch with the same first token
    tree.add(8, a + 1, -0.3)
    assert accept_length(tree, [7, 8, 9]) == 2


def test_lattice_object_and_json_forms_agree() -> None:
    js = {"tokens": [[5, 6], [7]], "logp": [[-0.1, -0.9], [-0.5]], "cond": [{}, {"6": [[8, -0.05]]}]}
    obj = Lattice.coerce(js)
    assert obj.cond[1] == {6: [(8, -0.05)]}
    assert Lattice.coerce(obj.to_json()) == obj
    assert best_first_tree(obj, 4).tokens == best_first_tree(js, 4).tokens
    with pytest.raises(ValueError, match="same shape"):
        Lattice.coerce({"tokens": [[1, 2]], "logp": [[-0.1]], "cond": []})
