"""Gated DeltaNet verification kernels in Triton (CUDA): stock chain, path, commit and WY.

`chain` is stock's chain verification: fla-core's fused recurrent gated delta rule (same tiles,
same operation order, so the same bits) that also writes a state snapshot after each position.
`path_verify` gives every tree node its output by walking its root path from the committed state,
one program per (value tile, head, node); `commit` replays the accepted path into the state. The
three share one step function, so on a chain they agree bit for bit. `wy_verify` solves all nodes
at once (reference.py's WY form): the products with the state run on tensor cores, the fp32 state
split into three bf16 pieces and the fp32 keys/queries into two, accumulated in fp32.

Layouts are reference.py's (batch 1, contiguous): q, k [T, H, K] and v [T, HV, V] bf16; g, beta
[T, HV]; states [HV, K, V] fp32. K and V up to 256, powers of two.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .layout import GdnInputError, TreeLayout
from .reference import check_inputs

BV_RECURRENT = 8  # fla-core's value tile for the fused recurrent kernel (one warp per program)
WY_MAX_NODES = 64  # the WY kernel holds a tree's N x N matrices in registers


@triton.jit
def _step(s, q, k, v, g, beta, t, i_h, i_hv, o_k, o_v, mk, mv, scale,
          H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L2NORM: tl.constexpr):  # fmt: skip
    """Token t through the rule on the state tile s [BK, BV] (fp32); returns it and the output."""
    b_q = tl.load(q + (t * H + i_h) * K + o_k, mask=mk, other=0).to(tl.float32)
    b_k = tl.load(k + (t * H + i_h) * K + o_k, mask=mk, other=0).to(tl.float32)
    b_v = tl.load(v + (t * HV + i_hv) * V + o_v, mask=mv, other=0).to(tl.float32)
    if L2NORM:
        b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
        b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
    b_q = b_q * scale
    b_beta = tl.load(beta + t * HV + i_hv).to(tl.float32)
    b_g = tl.load(g + t * HV + i_hv).to(tl.float32)
    s *= tl.exp(b_g)
    b_v = b_beta * (b_v - tl.sum(s * b_k[:, None], 0))
    s += b_k[:, None] * b_v
    return s, tl.sum(s * b_q[:, None], 0)


@triton.jit
def _tile(i_v, BK: tl.constexpr, BV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    return o_k, o_v, mk, mv, mk[:, None] & mv[None, :]


@triton.jit
def _load_state(h0, i_hv, o_k, o_v, mh, BK: tl.constexpr, BV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    s = tl.zeros([BK, BV], dtype=tl.float32)  # 0 + x, as fla-core (a -0 comes out +0)
    return s + tl.load(h0 + i_hv * K * V + o_k[:, None] * V + o_v[None, :], mask=mh, other=0).to(tl.float32)


@triton.jit
def chain_kernel(q, k, v, g, beta, h0, o, snaps, scale, T, H: tl.constexpr, HV: tl.constexpr,
                 K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 L2NORM: tl.constexpr, SNAP: tl.constexpr):  # fmt: skip
    i_v, i_hv = tl.program_id(0), tl.program_id(1)
    i_h = i_hv // (HV // H)
    o_k, o_v, mk, mv, mh = _tile(i_v, BK, BV, K, V)
    s = _load_state(h0, i_hv, o_k, o_v, mh, BK, BV, K, V)
    for t in range(T):
        s, b_o = _step(s, q, k, v, g, beta, t, i_h, i_hv, o_k, o_v, mk, mv, scale, H, HV, K, V, L2NORM)
        tl.store(o + (t * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=mv)
        if SNAP:
            tl.store(snaps + ((t * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :], s, mask=mh)


@triton.jit
def path_kernel(q, k, v, g, beta, h0, o, paths, depth, scale, D, H: tl.constexpr, HV: tl.constexpr,
                K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr):  # fmt: skip
    i_v, i_hv, n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    o_k, o_v, mk, mv, mh = _tile(i_v, BK, BV, K, V)
    s = _load_state(h0, i_hv, o_k, o_v, mh, BK, BV, K, V)
    steps = tl.load(depth + n)
    for d in range(steps - 1):  # the ancestors, root side first
        j = tl.load(paths + n * D + d)
        s, _ = _step(s, q, k, v, g, beta, j, i_h, i_hv, o_k, o_v, mk, mv, scale, H, HV, K, V, L2NORM)
    s, b_o = _step(s, q, k, v, g, beta, n, i_h, i_hv, o_k, o_v, mk, mv, scale, H, HV, K, V, L2NORM)
    tl.store(o + (n * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=mv)


@triton.jit
def commit_kernel(q, k, v, g, beta, h0, out, path, L, scale, T, H: tl.constexpr, HV: tl.constexpr,
                  K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr):  # fmt: skip
    i_v, i_hv, layer = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    q += layer * T * H * K  # layer `layer` of stacked inputs [layers, T, ...] and states [layers, HV, K, V]
    k += layer * T * H * K
    v += layer * T * HV * V
    g += layer * T * HV
    beta += layer * T * HV
    h0 += layer * HV * K * V
    out += layer * HV * K * V
    i_h = i_hv // (HV // H)
    o_k, o_v, mk, mv, mh = _tile(i_v, BK, BV, K, V)
    s = _load_state(h0, i_hv, o_k, o_v, mh, BK, BV, K, V)
    for d in range(L):
        j = tl.load(path + d)
        s, _ = _step(s, q, k, v, g, beta, j, i_h, i_hv, o_k, o_v, mk, mv, scale, H, HV, K, V, L2NORM)
    tl.store(out + (i_hv * K + o_k[:, None]) * V + o_v[None, :], s, mask=mh)


@triton.jit
def _split2(x):
    hi = x.to(tl.bfloat16)
    return hi, (x - hi.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _dot_state(a, s1, s2, s3):
    """a [NP, K] fp32 times the state tile s1 + s2 + s3 [K, BV] on tensor cores, fp32 sums."""
    hi, lo = _split2(a)
    acc = tl.dot(lo, s2)
    acc = tl.dot(hi, s3, acc)
    acc = tl.dot(lo, s1, acc)
    acc = tl.dot(hi, s2, acc)
    return tl.dot(hi, s1, acc)


@triton.jit
def _gram(a, b):
    """a b^T [NP, NP] for fp32 a, b [NP, K], from their two bf16 pieces each."""
    ah, al = _split2(a)
    bh, bl = _split2(b)
    acc = tl.dot(al, tl.trans(bh))
    acc = tl.dot(ah, tl.trans(bl), acc)
    return tl.dot(ah, tl.trans(bh), acc)


@triton.jit
def wy_kernel(q, k, v, g, beta, h0, o, u_out, anc, scale, N, H: tl.constexpr, HV: tl.constexpr,
              K: tl.constexpr, V: tl.constexpr, NP: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr):  # fmt: skip
    i_hv, i_v = tl.program_id(0), tl.program_id(1)
    i_h = i_hv // (HV // H)
    rows = tl.arange(0, NP)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    mr = rows < N
    b_k = tl.load(k + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=mr[:, None], other=0).to(tl.float32)
    b_q = tl.load(q + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=mr[:, None], other=0).to(tl.float32)
    if L2NORM:
        b_k = b_k / tl.sqrt(tl.sum(b_k * b_k, 1) + 1e-6)[:, None]
        b_q = b_q / tl.sqrt(tl.sum(b_q * b_q, 1) + 1e-6)[:, None]
    b_q = b_q * scale
    b_v = tl.load(v + (rows[:, None] * HV + i_hv) * V + o_v[None, :], mask=mr[:, None], other=0).to(
        tl.float32
    )
    b_g = tl.load(g + rows * HV + i_hv, mask=mr, other=0).to(tl.float32)
    b_beta = tl.load(beta + rows * HV + i_hv, mask=mr, other=0).to(tl.float32)
    a = tl.load(anc + rows[:, None] * N + rows[None, :], mask=mr[:, None] & mr[None, :], other=0) != 0
    gam = tl.sum(tl.where(a, b_g[None, :], 0.0), 1)
    decay = tl.exp(tl.where(a, gam[:, None] - gam[None, :], float("-inf")))
    # the state tile [K, BV] in three bf16 pieces (8 + 8 + 8 mantissa bits: all of fp32's 24)
    s = tl.load(h0 + (i_hv * K + o_k[:, None]) * V + o_v[None, :])
    s1 = s.to(tl.bfloat16)
    r = s - s1.to(tl.float32)
    s2 = r.to(tl.bfloat16)
    s3 = (r - s2.to(tl.float32)).to(tl.bfloat16)
    strict = a & (rows[:, None] != rows[None, :])
    b = b_beta[:, None] * tl.where(strict, decay * _gram(b_k, b_k), 0.0)
    e = tl.exp(gam)
    u = b_beta[:, None] * (b_v - e[:, None] * _dot_state(b_k, s1, s2, s3))
    for i in range(1, N):  # forward substitution: (I + B) U = RHS, B strictly lower (parents first)
        row = tl.sum(tl.where(rows[:, None] == i, b, 0.0), 0)
        c = tl.sum(row[:, None] * u, 0)
        u = tl.where(rows[:, None] == i, u - c[None, :], u)
    m = tl.where(a, decay * _gram(b_q, b_k), 0.0)
    b_o = e[:, None] * _dot_state(b_q, s1, s2, s3) + tl.dot(m, u, input_precision="ieee")
    out = (rows[:, None] * HV + i_hv) * V + o_v[None, :]
    tl.store(o + out, b_o.to(o.dtype.element_ty), mask=mr[:, None])
    tl.store(u_out + out, u, mask=mr[:, None])


# -- launchers ---------------------------------------------------------------------------------------


def _prepare(q, k, v, g, beta, h0, check: bool):
    """(T, H, K, HV, V) of the inputs; with `check` also the reference's input checks and CUDA layout."""
    if check:
        check_inputs(q, k, v, g, beta, h0)
        for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("state", h0)):
            if not x.is_cuda or not x.is_contiguous():
                raise GdnInputError(f"{name} must be a contiguous CUDA tensor")
    t, h, kd = q.shape
    hv, vd = v.shape[1:]
    for d, name in ((kd, "K"), (vd, "V")):
        if d & (d - 1) or not 16 <= d <= 256:
            raise GdnInputError(f"{name} = {d}: the kernels take K and V powers of two in 16..256")
    return t, h, kd, hv, vd


def chain(
    q, k, v, g, beta, h0, scale: float, l2norm: bool = True, snapshots: bool = True, check: bool = True
):
    """Stock chain verification: outputs [T, HV, V] (v's dtype), snapshots [T, HV, K, V] fp32 or None."""
    t, h, kd, hv, vd = _prepare(q, k, v, g, beta, h0, check)
    o = torch.empty_like(v)
    snaps = torch.empty(t, hv, kd, vd, dtype=torch.float32, device=v.device) if snapshots else o
    chain_kernel[(vd // BV_RECURRENT, hv)](q, k, v, g, beta, h0, o, snaps, scale, t, H=h, HV=hv, K=kd, V=vd, BK=kd,
                                           BV=BV_RECURRENT, L2NORM=l2norm, SNAP=snapshots, num_warps=1, num_stages=3)  # fmt: skip
    return o, (snaps if snapshots else None)


class DeviceTree:
    """A TreeLayout's tables on the device, built once per tree (not per layer)."""

    def __init__(self, layout: TreeLayout, device):
        self.layout = layout
        self.paths = layout.path_table(device).contiguous()
        self.depth = torch.tensor(layout.depth, dtype=torch.int32, device=device)
        self.anc = layout.ancestors(device).to(torch.uint8).contiguous()


def path_verify(
    tree: DeviceTree, q, k, v, g, beta, h0, scale: float, l2norm: bool = True, check: bool = True
):
    """Every node's output [N, HV, V] along its root path from the committed state h0."""
    n, h, kd, hv, vd = _prepare(q, k, v, g, beta, h0, check)
    if n != len(tree.layout):
        raise GdnInputError(f"the tree has {len(tree.layout)} nodes but the inputs hold {n} tokens")
    o = torch.empty_like(v)
    path_kernel[(vd // BV_RECURRENT, hv, n)](q, k, v, g, beta, h0, o, tree.paths, tree.depth, scale,
                                             tree.paths.shape[1], H=h, HV=hv, K=kd, V=vd, BK=kd, BV=BV_RECURRENT,
                                             L2NORM=l2norm, num_warps=1, num_stages=3)  # fmt: skip
    return o


def commit(path: Sequence[int] | torch.Tensor, q, k, v, g, beta, h0, scale: float, l2norm: bool = True,
           out: torch.Tensor | None = None, check: bool = True):  # fmt: skip
    """The state after the accepted root path (node indices, root side first); `out` may be h0.

    One layer (q [T, H, K], ..., h0 [HV, K, V]) or all layers in one launch: inputs stacked
    [layers, T, ...] and states [layers, HV, K, V] (commit needs nothing from the layer below).
    """
    layers = q.shape[0] if q.dim() == 4 else 1
    one = (lambda x: x[0]) if q.dim() == 4 else (lambda x: x)
    if check and q.dim() == 4:
        for name, x in (("k", k), ("v", v), ("g", g), ("beta", beta), ("state", h0)):
            if x.shape[0] != layers:
                raise GdnInputError(
                    f"stacked inputs need {layers} layers in every tensor; {name} has {x.shape[0]}"
                )
    n, h, kd, hv, vd = _prepare(*(one(x) for x in (q, k, v, g, beta, h0)), check)
    if check and not all(x.is_contiguous() for x in (q, k, v, g, beta, h0)):
        raise GdnInputError("stacked inputs must be contiguous")
    if not isinstance(path, torch.Tensor):
        if any(not 0 <= j < n for j in path):
            raise GdnInputError(f"the accepted path {list(path)} names a node outside 0..{n - 1}")
        path = torch.tensor(list(path), dtype=torch.int32, device=v.device)
    out = torch.empty_like(h0) if out is None else out
    commit_kernel[(vd // BV_RECURRENT, hv, layers)](q, k, v, g, beta, h0, out, path, path.numel(), scale, n, H=h,
                                                    HV=hv, K=kd, V=vd, BK=kd, BV=BV_RECURRENT, L2NORM=l2norm,
                                                    num_warps=1, num_stages=3)  # fmt: skip
    return out


def wy_verify(tree: DeviceTree, q, k, v, g, beta, h0, scale: float, l2norm: bool = True, check: bool = True,
              bv: int = 64, num_warps: int = 8):  # fmt: skip
    """All nodes' outputs [N, HV, V] by the WY form, and U [N, HV, V] fp32 (the corrected values)."""
    n, h, kd, hv, vd = _prepare(q, k, v, g, beta, h0, check)
    if n != len(tree.layout):
        raise GdnInputError(f"the tree has {len(tree.layout)} nodes but the inputs hold {n} tokens")
    if n > WY_MAX_NODES:
        raise GdnInputError(f"the WY kernel takes at most {WY_MAX_NODES} nodes per tree, got {n}")
    o = torch.empty_like(v)
    u = torch.empty(n, hv, vd, dtype=torch.float32, device=v.device)
    np_ = max(16, triton.next_power_of_2(n))
    bv = min(bv, vd)  # a value tile no wider than V (both powers of two)
    wy_kernel[(hv, vd // bv)](q, k, v, g, beta, h0, o, u, tree.anc, scale, n, H=h, HV=hv, K=kd, V=vd, NP=np_,
                              BV=bv, L2NORM=l2norm, num_warps=num_warps)  # fmt: skip
    return o, u
