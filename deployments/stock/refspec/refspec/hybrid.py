"""A hybrid target: Gated DeltaNet layers and attention layers (3:1), as in Qwen3-Next-style models.

Layer i is attention when (i + 1) % interval == 0, else GDN. A GDN layer keeps a recurrent state
S [HV, K, V] fp32 per value head instead of a KV cache; each token updates it by the gated delta
rule (fla-core's fused recurrent kernel: L2-normalised q and k, q scaled by K^-1/2):

    S <- exp(g) S;   u = beta (v - S^T k);   S <- S + k u^T;   o = S^T q

with g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b) from the layer's projections.
Stock verifies chains only: it runs the rule over the pass's rows and keeps a snapshot of S after
each row, and the next pass restores the snapshot of the last committed row. The engine commits
by moving `pos` (and `move_kv` for a tree's path), so the model settles lazily: at the start of
the next pass the rows kept are rows 0..a, with a = start - previous start - 1, or row 0 and the
path `move_kv` compacted. A tree pass (a mask other than causal) needs a GDN tree verifier
(`gdn_tree`, installed by a mechanism); stock refuses it. Short causal convolutions in front of
the GDN projections are not modelled. On CUDA with fla-core installed stock's rule is fla-core's
kernel, one launch per row (so each row's state is its snapshot); elsewhere the same rule in torch.

Weights are random (a seed and the shape): this model exists to time and test state handling on
hybrids, not to generate text. The engine interface is the Transformer's (setup_cache, prefill,
verify, move_kv).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .errors import RefspecError
from .model import PREFILL_CHUNK, region, rms_norm


@dataclass
class HybridArgs:
    vocab: int = 512
    hidden: int = 64
    intermediate: int = 128
    layers: int = 4
    interval: int = 4  # every interval-th layer is attention
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    gdn_key_heads: int = 2
    gdn_value_heads: int = 4
    gdn_head_dim: int = 16
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_positions: int = 4096

    def is_attention(self, i: int) -> bool:
        return (i + 1) % self.interval == 0

    @classmethod
    def from_config(cls, config: dict) -> HybridArgs:
        known = cls.__dataclass_fields__
        extra = sorted(set(config) - set(known) - {"model_type"})
        if extra:
            raise RefspecError(f"unknown hybrid model keys {extra}; known: {sorted(known)}")
        args = cls(**{k: v for k, v in config.items() if k in known})
        if args.gdn_value_heads % args.gdn_key_heads or args.heads % args.kv_heads:
            raise RefspecError(
                "value heads must be a multiple of key heads (GDN) and heads of kv_heads (attention)"
            )
        return args


def random_state(args: HybridArgs, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random fp32 weights of the hybrid shape (N(0, 0.02) matrices, unit norms, Qwen3-Next-like gates)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    h, hk, hv, dk = args.hidden, args.gdn_key_heads, args.gdn_value_heads, args.gdn_head_dim
    state = {
        "embed": torch.randn(args.vocab, h, generator=gen),
        "norm": torch.ones(h),
        "head": rnd(args.vocab, h),
    }
    for i in range(args.layers):
        p = f"layers.{i}."
        state |= {p + "ln1": torch.ones(h), p + "ln2": torch.ones(h), p + "gate_up": rnd(2 * args.intermediate, h),
                  p + "down": rnd(h, args.intermediate)}  # fmt: skip
        if args.is_attention(i):
            q, kv = args.heads * args.head_dim, args.kv_heads * args.head_dim
            state |= {p + "qkv": rnd(q + 2 * kv, h), p + "o": rnd(h, q)}
        else:
            state |= {p + "qkvab": rnd(2 * hk * dk + hv * dk + 2 * hv, h), p + "o": rnd(h, hv * dk),
                      p + "A_log": torch.rand(hv, generator=gen) * 2 - 1, p + "dt_bias": torch.zeros(hv),
                      p + "o_norm": torch.ones(dk)}  # fmt: skip
    return state


def gdn_chain(s, q, k, v, g, beta, snapshots: bool = True):
    """The rule over rows t = 0..T-1 from state s [HV, K, V]: outputs [T, HV, V] and the snapshots
    [T, HV, K, V] (or only the final state [1, HV, K, V] without `snapshots`).

    q, k [T, HV, K] fp32 (normalised, q scaled), v [T, HV, V], g, beta [T, HV] fp32.
    """
    outs, snaps = [], []
    for t in range(q.shape[0]):
        s = s * torch.exp(g[t])[:, None, None]
        u = beta[t][:, None] * (v[t] - (s * k[t][:, :, None]).sum(1))
        s = s + k[t][:, :, None] * u[:, None, :]
        outs.append((s * q[t][:, :, None]).sum(1))
        if snapshots:
            snaps.append(s)
    return torch.stack(outs), torch.stack(snaps) if snapshots else s[None]


def _fla_rule():
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except ImportError:
        return None
    return fused_recurrent_gated_delta_rule


class HybridModel:
    """Weights, the attention layers' static KV cache and the GDN layers' committed states."""

    def __init__(
        self, args: HybridArgs, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype
    ):
        self.args, self.device, self.dtype = args, device, dtype

        def w(name):
            if name not in state:
                raise RefspecError(f"hybrid weights miss tensor {name!r}")
            return state[name].to(device=device, dtype=dtype).contiguous()

        self.embed, self.norm, self.head = w("embed"), w("norm"), w("head")
        self.layers = []
        for i in range(args.layers):
            p = f"layers.{i}."
            mix = ("qkv", "o") if args.is_attention(i) else ("qkvab", "o", "o_norm")
            layer = {n: w(p + n) for n in ("ln1", "ln2", "gate_up", "down", *mix)}
            if not args.is_attention(i):
                layer["A_log"] = state[p + "A_log"].to(device=device, dtype=torch.float32)
                layer["dt_bias"] = state[p + "dt_bias"].to(device=device, dtype=torch.float32)
            self.layers.append(layer)
        self.attn_index = {i: n for n, i in enumerate(i for i in range(args.layers) if args.is_attention(i))}
        self.gdn_index = {
            i: n for n, i in enumerate(i for i in range(args.layers) if not args.is_attention(i))
        }
        d = args.head_dim
        inv = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        ang = torch.outer(torch.arange(args.max_positions, dtype=torch.float32), inv)
        self.rope = torch.polar(torch.ones_like(ang), ang).to(device)
        self.kv: torch.Tensor | None = None  # [attention layers, 2, H_kv, S_max, D]
        hv, dk = args.gdn_value_heads, args.gdn_head_dim
        self.state = torch.zeros(len(self.gdn_index), hv, dk, dk, device=device)  # committed, fp32
        self.pending: dict[str, Any] | None = None  # the last pass, settled at the next one
        self.moved: list[int] | None = None  # rows a tree's accepted path moved (move_kv)
        self.gdn_tree: Any = None  # a tree verifier (verify_layer, commit), set by a mechanism
        self.fla = _fla_rule() if device.type == "cuda" else None

    @property
    def capacity(self) -> int:
        return 0 if self.kv is None else self.kv.shape[3]

    def setup_cache(self, batch: int, max_len: int) -> None:
        """A new request: KV slots for max_len tokens, GDN states back to zero."""
        a = self.args
        if batch != 1:
            raise RefspecError("the hybrid model serves one request at a time (batch 1)")
        if max_len > a.max_positions:
            raise RefspecError(f"context of {max_len} tokens exceeds the model's {a.max_positions} positions")
        if self.capacity < max_len:
            size = min(a.max_positions, max(max_len, 256))
            self.kv = torch.zeros(len(self.attn_index), 2, a.kv_heads, size, a.head_dim, device=self.device,
                                  dtype=self.dtype)  # fmt: skip
        self.state.zero_()
        self.pending, self.moved = None, None

    # -- the engine's calls -------------------------------------------------------------------------

    def prefill(self, tokens: list[int], start: int) -> None:
        self._settle(start)
        for s in range(0, len(tokens), PREFILL_CHUNK):
            chunk = tokens[s : s + PREFILL_CHUNK]
            self._pass(chunk, list(range(start + s, start + s + len(chunk))), start + s, None, prefill=True)
            self._settle(start + s + len(chunk))  # every prompt row is committed

    def verify(self, tokens, positions, start, mask, head=None) -> list[int]:
        self._settle(start)
        hidden = self._pass(tokens, positions, start, mask)
        with region("lm_head"):
            x = rms_norm(hidden, self.norm, self.args.rms_eps)
            if head is not None:
                return head.argmax(x)
            return (x @ self.head.T).float().argmax(-1).tolist()

    def move_kv(self, src: list[int], dst: list[int]) -> None:
        s = torch.tensor(src, device=self.device)
        d = torch.tensor(dst, device=self.device)
        if self.kv is not None:
            self.kv.index_copy_(3, d, self.kv.index_select(3, s))
        if self.pending is not None:
            self.moved = [r - self.pending["start"] for r in src]

    # -- internals ------------------------------------------------------------------------------------

    def _settle(self, start: int) -> None:
        """Commit the last pass's kept rows into the GDN states (module docstring)."""
        p, self.pending = self.pending, None
        moved, self.moved = self.moved, None
        if p is None:
            return
        rows = [0, *moved] if moved is not None else list(range(start - p["start"]))
        if not rows:  # nothing of the pass was kept
            return
        if rows[-1] >= p["rows"]:
            raise RefspecError(f"the engine moved to slot {start}, past the last pass's {p['rows']} rows")
        if p["tree"] is None:  # a prefill keeps only its final state, and commits every row
            last = -1 if p["prefill"] else rows[-1]
            for j, snaps in enumerate(p["snaps"]):
                self.state[j] = snaps[last]
        else:
            self.state = self.gdn_tree.commit(rows, p["tree"], self.state)

    def _pass(self, tokens, positions, start, mask, prefill: bool = False) -> torch.Tensor:
        a, rows = self.args, len(tokens)
        tree = None if _is_causal(mask, rows) else _parents(mask)
        if tree is not None and self.gdn_tree is None:
            raise RefspecError("the hybrid model verifies chains only: a tree over GDN layers needs a GDN tree "
                               "mechanism (e.g. the refspec-gdn-tree entry)")  # fmt: skip
        with region("other"):
            x = F.embedding(torch.tensor(tokens, device=self.device), self.embed)
            pos = torch.tensor(positions, device=self.device)
            full = torch.ones(rows, start + rows, dtype=torch.bool, device=self.device)
            tail = (
                torch.tensor(mask, dtype=torch.bool)
                if tree is not None
                else torch.ones(rows, rows).tril().bool()
            )
            full[:, start:] = tail.to(self.device)
        snaps, tree_inputs = [], []
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer["ln1"], a.rms_eps)
            if a.is_attention(i):
                x = x + self._attention(self.attn_index[i], layer, h, pos, start, full) @ layer["o"].T
            else:
                j = self.gdn_index[i]
                o, saved = self._gdn(j, layer, h, tree, snapshots=not prefill)
                (snaps if tree is None else tree_inputs).append(saved)
                x = x + o @ layer["o"].T
            h = rms_norm(x, layer["ln2"], a.rms_eps)
            gate, up = (h @ layer["gate_up"].T).split(a.intermediate, dim=-1)
            x = x + (F.silu(gate) * up) @ layer["down"].T
        self.pending = {"start": start, "rows": rows, "snaps": snaps, "prefill": prefill,
                        "tree": None if tree is None else (tree, tree_inputs)}  # fmt: skip
        return x

    def _attention(self, n, layer, h, pos, start, full):
        a, rows = self.args, h.shape[0]
        hq, hk, d = a.heads, a.kv_heads, a.head_dim
        qkv = (h @ layer["qkv"].T).view(rows, hq + 2 * hk, d)
        qk = torch.view_as_real(torch.view_as_complex(qkv[:, : hq + hk].float().unflatten(-1, (-1, 2)))
                                * self.rope[pos][:, None]).flatten(-2).to(self.dtype)  # fmt: skip
        self.kv[n, 0, :, start : start + rows] = qk[:, hq:].transpose(0, 1)
        self.kv[n, 1, :, start : start + rows] = qkv[:, hq + hk :].transpose(0, 1)
        kv_len = start + rows
        bias = torch.zeros(full.shape, device=self.device, dtype=self.dtype).masked_fill_(
            ~full, float("-inf")
        )
        o = F.scaled_dot_product_attention(
            qk[:, :hq].transpose(0, 1), self.kv[n, 0, :, :kv_len].repeat_interleave(hq // hk, 0),
            self.kv[n, 1, :, :kv_len].repeat_interleave(hq // hk, 0), attn_mask=bias,
        )  # fmt: skip
        return o.transpose(0, 1).reshape(rows, hq * d)

    def _gdn(self, j, layer, h, tree, snapshots: bool):
        """Layer j's GDN mixer over the pass's rows: its output [rows, HV*V] and what settling needs."""
        a, rows = self.args, h.shape[0]
        hk, hv, dk = a.gdn_key_heads, a.gdn_value_heads, a.gdn_head_dim
        q, k, v, ga, b = (h @ layer["qkvab"].T).split([hk * dk, hk * dk, hv * dk, hv, hv], dim=-1)
        q, k, v = q.view(rows, hk, dk), k.view(rows, hk, dk), v.view(rows, hv, dk)
        g = -torch.exp(layer["A_log"]) * F.softplus(ga.float() + layer["dt_bias"])
        beta = torch.sigmoid(b.float())
        if tree is not None:
            o = self.gdn_tree.verify_layer(tree, q, k, v, g, beta, self.state[j])
            saved = (q, k, v, g, beta)
        elif self.fla is not None:
            o, saved = self._fla_chain(j, q, k, v, g, beta, snapshots)
        else:
            qn, kn = _normalise(q, k, hv // hk)
            o, saved = gdn_chain(self.state[j], qn, kn, v.float(), g, beta, snapshots)
        o = rms_norm(o.to(self.dtype), layer["o_norm"], a.rms_eps)
        return o.reshape(rows, hv * dk), saved

    def _fla_chain(self, j, q, k, v, g, beta, snapshots: bool):
        """fla-core's fused recurrent kernel, one launch per row, each row's final state its snapshot
        (without `snapshots`, one launch over all rows: the same bits, only the final state kept)."""
        s, outs, snaps = self.state[j][None], [], []
        if not snapshots:
            o, s = self.fla(q[None], k[None], v[None], g=g[None], beta=beta[None], scale=self.args.gdn_head_dim**-0.5,
                            initial_state=s, output_final_state=True, use_qk_l2norm_in_kernel=True)  # fmt: skip
            return o[0], s
        for t in range(q.shape[0]):
            o, s = self.fla(q[t : t + 1][None], k[t : t + 1][None], v[t : t + 1][None], g=g[t : t + 1][None],
                            beta=beta[t : t + 1][None], scale=self.args.gdn_head_dim**-0.5,
                            initial_state=s, output_final_state=True, use_qk_l2norm_in_kernel=True)  # fmt: skip
            outs.append(o[0, 0])
            snaps.append(s[0])
        return torch.stack(outs), torch.stack(snaps)


def _normalise(q, k, rep: int):
    """fla-core's in-kernel L2 norm (+1e-6 under the root), q scaled by K^-1/2, per value head, fp32."""
    q, k = q.float(), k.float()
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * q.shape[-1] ** -0.5
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    return q.repeat_interleave(rep, 1), k.repeat_interleave(rep, 1)


def _is_causal(mask, rows: int) -> bool:
    return mask is None or all(mask[r][c] == (c <= r) for r in range(rows) for c in range(rows))


def _parents(mask) -> list[int]:
    """A tree pass's parent of each row from its ancestor mask (row 0 is the root: -1)."""
    parents = [-1]
    for r in range(1, len(mask)):
        above = [c for c in range(r) if mask[r][c]]
        p = above[-1] if above else -1
        if p < 0 or not mask[r][r] or above != [c for c in range(p + 1) if mask[p][c]]:
            raise RefspecError(
                f"row {r}'s mask is not its parent's ancestors plus itself; a tree pass needs one"
            )
        parents.append(p)
    return parents
