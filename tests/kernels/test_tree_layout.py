"""Tree layout for one verification pass: `tree_mask` (ancestor-only attention) and `tree_positions`."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.kernels.tree import ROOT, Tree, best_first_tree, chain, tree_mask, tree_positions

from .test_tree import lattices


def ancestors(tree: Tree, i: int) -> set[int]:
    """Node indices on node i's root path, i excluded (written out from the parents list)."""
    out, p = set(), tree.parents[i]
    while p != ROOT:
        out.add(p)
        p = tree.parents[p]
    return out


@settings(max_examples=200, deadline=None)
@given(lat=lattices(max_m=5, max_k=3), n=st.integers(0, 24), conditioned=st.booleans())
def test_mask_is_self_root_and_ancestors(lat: dict, n: int, conditioned: bool) -> None:
    tree = best_first_tree(lat, n, conditioned=conditioned)
    mask = tree_mask(tree)
    assert mask.dtype == torch.bool and mask.shape == (len(tree) + 1, len(tree) + 1)
    assert mask[0].tolist() == [True] + [False] * len(tree), "the root row sees only itself"
    for i in range(len(tree)):
        want = {0, i + 1} | {a + 1 for a in ancestors(tree, i)}
        assert {c for c in range(len(tree) + 1) if mask[i + 1, c]} == want
    # Parents precede children, so no row sees a later row: the mask is lower triangular.
    assert not mask.triu(1).any()


@settings(max_examples=200, deadline=None)
@given(lat=lattices(max_m=5, max_k=3), n=st.integers(0, 24), start=st.integers(0, 5000))
def test_positions_are_start_plus_depth(lat: dict, n: int, start: int) -> None:
    tree = best_first_tree(lat, n)
    pos = tree_positions(tree, start)
    assert pos.dtype == torch.long
    assert pos.tolist() == [start] + [start + d for d in tree.depths]
    # A node's position is its parent's plus one (the root's children at start + 1).
    for i, p in enumerate(tree.parents):
        assert pos[i + 1] == pos[p + 1] + 1


@settings(max_examples=100, deadline=None)
@given(lat=lattices(max_m=6), start=st.integers(0, 100))
def test_a_chain_is_laid_out_as_stock_verifies_it(lat: dict, start: int) -> None:
    """The chain tree gives stock's causal mask and consecutive positions."""
    tree = chain(lat)
    n = len(tree) + 1
    assert torch.equal(tree_mask(tree), torch.ones(n, n, dtype=torch.bool).tril())
    assert torch.equal(tree_positions(tree, start), torch.arange(start, start + n))


def test_empty_tree_is_the_root_row() -> None:
    assert tree_mask(Tree()).tolist() == [[True]]
    assert tree_positions(Tree(), 7).tolist() == [7]


def test_mask_by_hand() -> None:
    # root ─ a(0) ─ c(2)
    #      └ b(1) ─ d(3) ─ e(4)
    tree = Tree()
    for tok, parent in ((10, ROOT), (11, ROOT), (12, 0), (13, 1), (14, 3)):
        tree.add(tok, parent, 0.0)
    assert tree_mask(tree).int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 0, 1, 0, 1, 0],
        [1, 0, 1, 0, 1, 1],
    ]
    assert tree_positions(tree, 100).tolist() == [100, 101, 101, 102, 102, 103]


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [rows, d] at positions pos [rows] (adjacent pairs)."""
    d = x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rot = torch.polar(torch.ones(len(pos), d // 2, dtype=torch.float64), torch.outer(pos.double(), inv))
    return torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * rot).flatten(-2)


def attend(
    x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, w: tuple[torch.Tensor, ...]
) -> torch.Tensor:
    """One RoPE attention layer over rows x [rows, d] (float64): the op tree verification masks."""
    wq, wk, wv = w
    q, k, v = rope(x @ wq, pos), rope(x @ wk, pos), x @ wv
    s = (q @ k.T).masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


@settings(max_examples=60, deadline=None)
@given(lat=lattices(max_m=5, max_k=3), n=st.integers(1, 16), prefix=st.integers(1, 6), seed=st.integers(0, 9))
def test_one_tree_pass_equals_each_root_path_as_a_chain(lat: dict, n: int, prefix: int, seed: int) -> None:
    """With the tree's mask and positions, every node's output is the output its own root path
    gets as an ordinary causal sequence: what makes tree verification lossless."""
    tree = best_first_tree(lat, n)
    g = torch.Generator().manual_seed(seed)
    d = 8
    w = tuple(torch.randn(d, d, generator=g, dtype=torch.float64) for _ in range(3))
    emb = torch.randn(16, d, generator=g, dtype=torch.float64)  # token embeddings (tokens < 16)
    ctx = torch.randint(0, 16, (prefix,), generator=g).tolist()  # committed prefix, its last = root
    rows = ctx + tree.tokens
    nr = len(tree) + 1
    mask = torch.ones(len(rows), len(rows), dtype=torch.bool).tril()
    mask[prefix - 1 :, prefix - 1 :] = tree_mask(tree)
    pos = torch.cat([torch.arange(prefix - 1), tree_positions(tree, prefix - 1)])
    out = attend(emb[rows], pos, mask, w)[prefix - 1 :]
    assert out.shape[0] == nr
    for i in range(len(tree)):
        seq = ctx + tree.path(i)
        causal = torch.ones(len(seq), len(seq), dtype=torch.bool).tril()
        ref = attend(emb[seq], torch.arange(len(seq)), causal, w)[-1]
        torch.testing.assert_close(out[i + 1], ref, rtol=1e-10, atol=1e-10)


def test_tensors_land_on_the_requested_device() -> None:
    tree = chain({"tokens": [[1], [2]], "logp": [[0.0], [0.0]], "cond": [{}, {}]})
    dev = torch.device("cpu")
    assert tree_mask(tree, dev).device == dev and tree_positions(tree, 3, dev).device == dev
