"""GDN tree kernels on a CUDA GPU: stock chain against fla-core, path and commit against the chain
bit for bit, WY within one bf16 ulp of path, and the kernels against the PyTorch reference.
Skipped without CUDA; the fla-core comparison is skipped where fla-core is not installed."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
if torch.cuda.is_available():
    pytest.importorskip("triton")
    from specpilot.kernels.gdn import kernels as gk  # noqa: E402

from specpilot.kernels.gdn import TreeLayout, bf16_ulp_error, reference  # noqa: E402

from ..kernels.gdn_data import random_tree, state, tokens  # noqa: E402

QWEN = (16, 48, 128, 128)  # Qwen3.8-27B's GDN: 16 key heads, 48 value heads, 128 x 128 state
SCALE = 128**-0.5


def inputs(n, seed=0, shape=QWEN):
    h, hv, kd, vd = shape
    return tokens(n, h, hv, kd, vd, seed=seed, device="cuda"), state(hv, kd, vd, seed=seed + 1, device="cuda")


def test_stock_chain_is_fla_cores_fused_recurrent_bit_for_bit():
    fla = pytest.importorskip("fla.ops.gated_delta_rule", reason="fla-core is not installed")
    x, h0 = inputs(8)
    o, snaps = gk.chain(*x, h0, SCALE)
    q, k, v, g, beta = (t.unsqueeze(0) for t in x)
    o_fla, ht = fla.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, scale=SCALE, initial_state=h0[None],
                                                     output_final_state=True, use_qk_l2norm_in_kernel=True)  # fmt: skip
    assert torch.equal(o, o_fla[0])
    assert torch.equal(snaps[-1], ht[0])


def test_path_and_commit_on_chains_are_the_chain_bit_for_bit():
    x, h0 = inputs(8, seed=2)
    o, snaps = gk.chain(*x, h0, SCALE)
    tree = gk.DeviceTree(TreeLayout.chain(8), "cuda")
    assert torch.equal(gk.path_verify(tree, *x, h0, SCALE), o)
    for a in range(1, 9):
        assert torch.equal(gk.commit(list(range(a)), *x, h0, SCALE), snaps[a - 1]), a


def test_tree_nodes_are_their_root_paths_bit_for_bit():
    layout = TreeLayout.of(random_tree(32, seed=4))
    x, h0 = inputs(32, seed=4)
    o = gk.path_verify(gk.DeviceTree(layout, "cuda"), *x, h0, SCALE)
    for n, path in enumerate(layout.paths):
        sub = [t[list(path)].contiguous() for t in x]
        o_chain, snaps = gk.chain(*sub, h0, SCALE)
        assert torch.equal(o[n], o_chain[-1]), n
        assert torch.equal(gk.commit(list(path), *x, h0, SCALE), snaps[-1]), n


@pytest.mark.parametrize(
    "n,shape", [(1, QWEN), (8, QWEN), (24, QWEN), (32, QWEN), (64, QWEN), (12, (2, 4, 32, 16))]
)
def test_wy_is_within_one_bf16_ulp_of_path(n, shape):
    layout = TreeLayout.of(random_tree(n, seed=n))
    tree = gk.DeviceTree(layout, "cuda")
    x, h0 = inputs(n, seed=n, shape=shape)
    o_path = gk.path_verify(tree, *x, h0, SCALE)
    o_wy, _ = gk.wy_verify(tree, *x, h0, SCALE)
    err = bf16_ulp_error(o_wy, o_path)
    assert err["scaled_max"] <= 1 and err["own_within_1"] >= 0.999, err


def test_kernels_against_the_reference():
    layout = TreeLayout.of(random_tree(24, seed=9))
    x, h0 = inputs(24, seed=9)
    cpu = [t.cpu() for t in x]
    want = reference.path_verify(layout, *cpu, h0.cpu(), SCALE)
    got = gk.path_verify(gk.DeviceTree(layout, "cuda"), *x, h0, SCALE)
    err = bf16_ulp_error(got.cpu(), want)  # two fp32 summation orders of the same recurrence
    assert err["scaled_max"] <= 2 and err["own_within_1"] >= 0.999, err
    path = list(layout.paths[-1])
    s_ref = reference.commit(path, *cpu, h0.cpu(), SCALE)
    assert torch.allclose(gk.commit(path, *x, h0, SCALE).cpu(), s_ref, rtol=1e-5, atol=1e-6)


def test_commit_of_stacked_layers_in_one_launch_is_each_layers_commit():
    layers = [inputs(12, seed=20 + i) for i in range(3)]
    stacked = [torch.stack([x[i] for x, _ in layers]) for i in range(5)]
    states = torch.stack([h0 for _, h0 in layers])
    path = [0, 1, 4]
    got = gk.commit(path, *stacked, states, SCALE)
    for i, (x, h0) in enumerate(layers):
        assert torch.equal(got[i], gk.commit(path, *x, h0, SCALE)), i


def test_commit_in_place_and_bad_input():
    x, h0 = inputs(4, seed=11)
    want = gk.commit([0, 1], *x, h0, SCALE)
    s = h0.clone()
    gk.commit([0, 1], *x, s, SCALE, out=s)
    assert torch.equal(s, want)
    with pytest.raises(reference.GdnInputError, match="contiguous CUDA"):
        gk.chain(x[0].cpu(), *x[1:], h0, SCALE)
    with pytest.raises(reference.GdnInputError, match="outside 0..3"):
        gk.commit([0, 7], *x, h0, SCALE)
    with pytest.raises(reference.GdnInputError, match="powers of two"):
        y, s0 = inputs(2, shape=(2, 2, 48, 16))
        gk.chain(*y, s0, SCALE)
