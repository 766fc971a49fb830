"""GDN tree verification, PyTorch reference (CPU): path and commit against stock's chain, WY against path."""

from __future__ import annotations

import pytest
import torch

from specpilot.kernels.gdn import (
    GdnInputError,
    TreeLayout,
    bf16_ulp_error,
    chain,
    commit,
    path_verify,
    snapshot_bytes,
    wy_verify,
)
from specpilot.kernels.gdn.reference import prepare

from .gdn_data import random_tree, state, tokens

H, HV, KD, VD = 2, 6, 32, 16  # GVA like Qwen3-Next's 16 key / 48 value heads, at a small width
SCALE = KD**-0.5


def test_path_on_a_chain_is_the_chain_bit_for_bit():
    x = tokens(9, H, HV, KD, VD)
    h0 = state(HV, KD, VD)
    o_chain, _ = chain(*x, h0, SCALE)
    o_path = path_verify(TreeLayout.chain(9), *x, h0, SCALE)
    assert torch.equal(o_path, o_chain)


def test_commit_of_an_accepted_prefix_is_stocks_snapshot_bit_for_bit():
    x = tokens(8, H, HV, KD, VD, seed=3)
    h0 = state(HV, KD, VD)
    _, snaps = chain(*x, h0, SCALE)
    for a in range(1, 9):
        assert torch.equal(commit(list(range(a)), *x, h0, SCALE), snaps[a - 1]), a
    assert torch.equal(commit([], *x, h0, SCALE), h0)  # nothing accepted: the bonus token only


def test_a_nodes_output_is_its_root_path_run_as_a_chain():
    parents = random_tree(20, seed=5)
    layout = TreeLayout.of(parents)
    x = tokens(20, H, HV, KD, VD, seed=5)
    h0 = state(HV, KD, VD, seed=7)
    o = path_verify(layout, *x, h0, SCALE)
    for n, path in enumerate(layout.paths):
        sub = [t[list(path)] for t in x]
        o_chain, snaps = chain(*sub, h0, SCALE)
        assert torch.equal(o[n], o_chain[-1]), n
        assert torch.equal(commit(list(path), *x, h0, SCALE), snaps[-1]), n


@pytest.mark.parametrize(
    "parents", [random_tree(24, seed=1), random_tree(32, seed=2), [-1] * 8, list(range(-1, 11))]
)
def test_wy_is_within_one_bf16_ulp_of_path(parents):
    layout = TreeLayout.of(parents)
    n = len(parents)
    x = tokens(n, H, HV, KD, VD, seed=n)
    h0 = state(HV, KD, VD, seed=n + 1)
    o_path = path_verify(layout, *x, h0, SCALE)
    o_wy, u = wy_verify(layout, *x, h0, SCALE)
    assert (o_wy - o_path).abs().max() <= 1e-5 * o_path.abs().max()
    err = bf16_ulp_error(o_wy, o_path)
    assert err["scaled_max"] <= 1 and err["own_within_1"] >= 0.999, err
    # U holds each node's corrected value beta (v - (exp(g) S_parent)^T k), S_parent from its path.
    q, k, g, beta = prepare(x[0], x[1], x[3], x[4], HV, SCALE, True)
    for i, path in enumerate(layout.paths):
        s = commit(list(path[:-1]), *x, h0, SCALE) * torch.exp(g[i])[:, None, None]
        want = beta[i][:, None] * (x[2][i].float() - (s * k[i][:, :, None]).sum(1))
        assert torch.allclose(u[i], want, rtol=1e-4, atol=1e-5), i


def test_snapshots_per_node_against_the_tree_at_n24_on_qwen_shapes():
    # 48 GDN layers, 48 value heads of 128 x 128 fp32: 3.1 MB of state per layer per snapshot.
    assert snapshot_bytes(24, 48, 48, 128, 128) == 24 * 48 * 48 * 128 * 128 * 4 == 3_623_878_656


def test_own_ulps_count_representable_steps():
    one = torch.tensor([[1.0]])
    nxt = torch.tensor([[1.0 + 2**-7]])  # the next bf16 above 1
    assert bf16_ulp_error(one, nxt)["own_max"] == 1
    tiny = torch.tensor([[2.0**-133]])  # the smallest positive bf16 denormal
    assert bf16_ulp_error(tiny, -tiny)["own_max"] == 2
    assert bf16_ulp_error(torch.tensor([[0.0]]), torch.tensor([[-0.0]]))["own_max"] == 0


def test_ulp_error_measures_near_zero_outputs_at_their_rows_scale():
    b = torch.tensor([[1.0, 0.5, 1e-9]])
    a = torch.tensor([[1.0 + 2**-6, 0.5, -1e-9]])  # two ulps off at 1.0; a sign flip at 1e-9
    err = bf16_ulp_error(a, b)
    assert err["own_max"] > 1000  # 1e-9 and -1e-9 are thousands of representable steps apart
    assert err["scaled_max"] == 2.0  # at the row's scale only the first element is off, by 2 ulps
    assert err["bit_equal"] == pytest.approx(1 / 3)


def test_bad_input_gets_one_clear_error():
    x = tokens(4, H, HV, KD, VD)
    h0 = state(HV, KD, VD)
    with pytest.raises(GdnInputError, match="parent must be -1 .* or an earlier node"):
        TreeLayout.of([-1, 2, 0])
    with pytest.raises(GdnInputError, match="no nodes"):
        TreeLayout.of([])
    with pytest.raises(GdnInputError, match="3 nodes but the inputs hold 4"):
        path_verify(TreeLayout.chain(3), *x, h0, SCALE)
    with pytest.raises(GdnInputError, match="names node 4"):
        commit([0, 4], *x, h0, SCALE)
    with pytest.raises(GdnInputError, match="float32"):
        chain(*x, h0.double(), SCALE)
    bad = x[3].clone()
    bad[1, 0] = float("nan")
    with pytest.raises(GdnInputError, match="g holds a NaN"):
        chain(x[0], x[1], x[2], bad, x[4], h0, SCALE)
    with pytest.raises(GdnInputError, match="multiple of H"):
        chain(x[0], x[1], x[2][:, :5], x[3][:, :5], x[4][:, :5], h0[:5], SCALE)
