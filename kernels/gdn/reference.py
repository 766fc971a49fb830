"""Gated DeltaNet state update, PyTorch reference (any device, fp32): chain, path, commit and WY.

One GDN head h of key width K and value width V keeps a state S [K, V]. Token t with query q_t,
key k_t (after L2 normalisation, q_t also scaled), value v_t, log decay g_t <= 0 and write strength
beta_t updates it (the gated delta rule, as fla-core's fused recurrent kernel computes it):

    S   <- exp(g_t) S
    u_t  = beta_t (v_t - S^T k_t)          the corrected value ("v_new")
    S   <- S + k_t u_t^T
    o_t  = S^T q_t

Verification of a chain (stock) runs this over the draft positions and keeps a snapshot of S after
each one, so that acceptance of a tokens restores snapshot a. A tree would need a snapshot per
node; instead the path form recomputes node n's output along its root path from the committed
state, and commit replays the accepted path into it. The WY form (after TreeWY) solves all nodes
at once: with Gamma_i the summed log decay over i's root path and A the ancestor mask (self
included),

    (I + diag(beta) (A_strict * exp(Gamma_i - Gamma_j) * K K^T)) U = diag(beta) (V - exp(Gamma) K S0)
    O = exp(Gamma) Q S0 + (A * exp(Gamma_i - Gamma_j) * Q K^T) U

so the work with the state is two [N, K] x [K, V] products (tensor cores on the GPU) and the rest
is N x N. Layout as fla-core's (batch 1): q, k [T, H, K]; v [T, HV, V]; g, beta [T, HV]; states
[HV, K, V] fp32; value head hv reads key head hv // (HV // H).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .layout import GdnInputError, TreeLayout


def check_inputs(q, k, v, g, beta, h0) -> None:
    """One clear error for shapes and dtypes the kernels cannot take."""
    if q.dim() != 3 or k.shape != q.shape:
        raise GdnInputError(f"q and k must both be [T, H, K]; got {tuple(q.shape)} and {tuple(k.shape)}")
    t, h, kd = q.shape
    if v.dim() != 3 or v.shape[0] != t or v.shape[1] % h:
        raise GdnInputError(
            f"v must be [T, HV, V] with T = {t} and HV a multiple of H = {h}; got {tuple(v.shape)}"
        )
    hv, vd = v.shape[1:]
    for name, x in (("g", g), ("beta", beta)):
        if x.shape != (t, hv):
            raise GdnInputError(f"{name} must be [T, HV] = [{t}, {hv}]; got {tuple(x.shape)}")
    if h0.shape != (hv, kd, vd) or h0.dtype != torch.float32:
        raise GdnInputError(
            f"the state must be float32 [HV, K, V] = [{hv}, {kd}, {vd}]; got {h0.dtype} {tuple(h0.shape)}"
        )
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("state", h0)):
        if x.is_floating_point() and not torch.isfinite(x).all():
            raise GdnInputError(f"{name} holds a NaN or inf; the gated delta rule needs finite inputs")


def prepare(q, k, g, beta, hv: int, scale: float, l2norm: bool):
    """fp32 q (normalised, scaled) and k (normalised) per value head [T, HV, K]; g, beta fp32."""
    q, k = q.float(), k.float()
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * scale
    rep = hv // q.shape[1]
    return q.repeat_interleave(rep, 1), k.repeat_interleave(rep, 1), g.float(), beta.float()


def step(s, q, k, v, g, beta):
    """One token through the rule for all heads: s [HV, K, V]; q, k [HV, K]; v [HV, V]; g, beta [HV]."""
    s = s * torch.exp(g)[:, None, None]
    u = beta[:, None] * (v - (s * k[:, :, None]).sum(1))
    s = s + k[:, :, None] * u[:, None, :]
    return s, (s * q[:, :, None]).sum(1)


def chain(q, k, v, g, beta, h0, scale: float, l2norm: bool = True):
    """Stock chain verification: outputs [T, HV, V] fp32 and the state snapshot after each position."""
    check_inputs(q, k, v, g, beta, h0)
    qh, kh, g, beta = prepare(q, k, g, beta, v.shape[1], scale, l2norm)
    s, outs, snaps = h0, [], []
    for t in range(q.shape[0]):
        s, o = step(s, qh[t], kh[t], v[t].float(), g[t], beta[t])
        outs.append(o)
        snaps.append(s)
    return torch.stack(outs), torch.stack(snaps)


def path_verify(layout: TreeLayout, q, k, v, g, beta, h0, scale: float, l2norm: bool = True):
    """Each node's output [N, HV, V] fp32, recomputed along its root path from the committed state."""
    _check_tree(layout, q)
    check_inputs(q, k, v, g, beta, h0)
    qh, kh, g, beta = prepare(q, k, g, beta, v.shape[1], scale, l2norm)
    outs = []
    for path in layout.paths:
        s = h0
        for j in path:
            s, o = step(s, qh[j], kh[j], v[j].float(), g[j], beta[j])
        outs.append(o)
    return torch.stack(outs)


def commit(path: Sequence[int], q, k, v, g, beta, h0, scale: float, l2norm: bool = True):
    """The state after the accepted root path `path` (node indices, root side first)."""
    check_inputs(q, k, v, g, beta, h0)
    qh, kh, g, beta = prepare(q, k, g, beta, v.shape[1], scale, l2norm)
    s = h0
    for j in path:
        if not 0 <= j < q.shape[0]:
            raise GdnInputError(f"the accepted path names node {j}; nodes are 0..{q.shape[0] - 1}")
        s, _ = step(s, qh[j], kh[j], v[j].float(), g[j], beta[j])
    return s


def wy_verify(layout: TreeLayout, q, k, v, g, beta, h0, scale: float, l2norm: bool = True):
    """All nodes' outputs [N, HV, V] at once by the WY form (module docstring), and U [N, HV, V]."""
    _check_tree(layout, q)
    check_inputs(q, k, v, g, beta, h0)
    qh, kh, g, beta = prepare(q, k, g, beta, v.shape[1], scale, l2norm)
    anc = layout.ancestors(q.device)
    strict = anc & ~torch.eye(len(layout), dtype=torch.bool, device=q.device)
    outs, us = [], []
    for h in range(v.shape[1]):
        gam = anc.float() @ g[:, h]
        decay = torch.exp(torch.where(anc, gam[:, None] - gam[None, :], float("-inf")))
        kq, kk_, s0 = qh[:, h], kh[:, h], h0[h]
        b = beta[:, h, None] * torch.where(strict, decay * (kk_ @ kk_.T), 0.0)
        rhs = beta[:, h, None] * (v[:, h].float() - torch.exp(gam)[:, None] * (kk_ @ s0))
        eye = torch.eye(len(layout), device=q.device)
        u = torch.linalg.solve_triangular(eye + b, rhs, upper=False, unitriangular=True)
        o = torch.exp(gam)[:, None] * (kq @ s0) + (decay * (kq @ kk_.T)) @ u
        outs.append(o)
        us.append(u)
    return torch.stack(outs, 1), torch.stack(us, 1)


def snapshot_bytes(nodes: int, layers: int, hv: int, kd: int, vd: int) -> int:
    """Bytes of per-node fp32 state snapshots (what a tree costs under stock's chain scheme)."""
    return nodes * layers * hv * kd * vd * 4


def bf16_ulp_error(a: torch.Tensor, b: torch.Tensor) -> dict:
    """How far outputs `a` sit from `b` (both [..., V], rounded to bf16) in bf16 ulps.

    `own`: the distance in representable steps, element by element; an output that is a near-zero
    cancellation (far below its row's scale) has a tiny ulp, so two fp32 summation orders can be
    thousands of its ulps apart while agreeing to 1e-9. `scaled`: |a - b| in ulps of the larger of
    |b| and its row's RMS, so a near-zero element is measured at its row's scale; within one bf16
    ulp is `scaled_max <= 1`. Fractions are over all elements.
    """
    a16, b16 = a.to(torch.bfloat16).float(), b.to(torch.bfloat16).float()
    own = (_ordered(a) - _ordered(b)).abs()
    rms = b16.pow(2).mean(-1, keepdim=True).sqrt()
    ref = torch.maximum(b16.abs(), rms).clamp_min(torch.finfo(torch.float32).tiny)
    ulp = torch.exp2(torch.floor(torch.log2(ref)) - 7)  # bf16 keeps 7 explicit mantissa bits
    scaled = (a16 - b16).abs() / ulp
    return {"own_max": int(own.max()), "own_within_1": float((own <= 1).float().mean()),
            "bit_equal": float((own == 0).float().mean()), "scaled_max": float(scaled.max())}  # fmt: skip


def _ordered(x):
    bits = x.to(torch.bfloat16).contiguous().view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)  # sign-magnitude to a monotone line


def _check_tree(layout: TreeLayout, q) -> None:
    if len(layout) != q.shape[0]:
        raise GdnInputError(
            f"the tree has {len(layout)} nodes but the inputs hold {q.shape[0]} tokens; pass one token per node"
        )
