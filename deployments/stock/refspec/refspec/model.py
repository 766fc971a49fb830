"""Llama-family forward with a static KV cache and explicit verification masks (gpt-fast style).

One `Transformer` holds the weights of an HF Llama folder, fused for few large ops: Q, K and V
are one matrix, gate and up are one matrix. The KV cache is static, `[B, H_kv, S_max, D]` per
layer, indexed by slot: a forward writes its rows' K/V at the given slots, and each row attends
to the cache slots its boolean mask allows. Rolling back rejected drafts is free (the caller
moves its position; stale slots are never attended because no mask admits them). Rows carry
explicit RoPE positions, so a later tree entry can verify nodes at slot = start + node index and
position = start + depth with the same forward.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .errors import RefspecError
from .synthetic import MARK, synthetic_state
from .weights import load_config, load_state_dict

# Profile regions (refspec.<class>) are labelled only while profile.py turns this on: a
# record_function per op would cost more than the ops themselves on one CPU core.
PROFILING = False
_NULL = contextlib.nullcontext()


def region(name: str):
    """A `refspec.<name>` profiler region while profiling, else a no-op context."""
    return torch.profiler.record_function(f"refspec.{name}") if PROFILING else _NULL


@dataclass
class ModelArgs:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    max_positions: int
    tied: bool

    @classmethod
    def from_hf(cls, config: dict) -> ModelArgs:
        arch = config.get("architectures") or []
        if config.get("model_type") != "llama" and "LlamaForCausalLM" not in arch:
            raise RefspecError(
                f"model type {config.get('model_type')!r} is not Llama; refspec runs Llama-family HF folders"
            )
        for unsupported in ("rope_scaling", "attention_bias", "mlp_bias"):
            if config.get(unsupported):
                raise RefspecError(
                    f"config.json sets {unsupported}, which refspec's Llama model does not support"
                )
        heads = config["num_attention_heads"]
        return cls(
            vocab=config["vocab_size"],
            hidden=config["hidden_size"],
            intermediate=config["intermediate_size"],
            layers=config["num_hidden_layers"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            rms_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=config.get("rope_theta", 10000.0),
            max_positions=config.get("max_position_embeddings", 4096),
            tied=bool(config.get("tie_word_embeddings", False)),
        )


def _interleave(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder each head's Q/K rows from HF's rotate-half halves to adjacent RoPE pairs.

    Pair j of a head is (j, j + D/2) in HF's layout; adjacent pairs let RoPE be one complex
    multiply. Q and K are reordered alike, so q·k, and with it attention, is unchanged.
    """
    rows = w.shape[0]
    return w.view(heads, 2, rows // heads // 2, -1).transpose(1, 2).reshape(w.shape)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Llama's RMSNorm, op for op, so refspec's logits follow HF's as closely as fp32 allows."""
    if x.dtype != torch.float32:  # HF normalizes in fp32 and scales in the model's dtype
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


PREFILL_CHUNK = 256  # prompt rows per prefill pass (bounds the [rows, kv_len] score buffers)
PACK_ROWS = 16  # oneDNN blocks the packed layout for this many rows
GEMV_ROWS = 1  # a single row (AR) streams W^T (GEMV); two rows and more use the packed GEMM


class Linear:
    """One weight matrix [out, in] in the layouts its kernels want (y = x @ W^T).

    On one CPU core the best kernel depends on the row count: a GEMV streams W^T stored
    [in, out] at close to memory bandwidth (MKL), while a GEMM over a few rows runs 1.4-2x faster
    from oneDNN's blocked layout than from MKL (bench/refspec_rows.py). `dual` keeps both (the
    cost is a second copy of the weights); CUDA keeps the plain weight for cuBLAS.
    """

    __slots__ = ("plain", "gemv", "packed")

    def __init__(self, w: torch.Tensor, cpu_layout: str):
        self.plain = self.gemv = self.packed = None
        if cpu_layout in ("gemv", "dual"):
            self.gemv = w.t().contiguous()
        if cpu_layout in ("onednn", "dual"):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
        if self.gemv is None and self.packed is None:
            self.plain = w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemv is not None and (x.shape[0] <= GEMV_ROWS or self.packed is None):
            return torch.mm(x, self.gemv)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        return F.linear(x, self.plain)


def cpu_layouts() -> tuple[str, ...]:
    """Weight layouts this torch build supports on CPU ('onednn'/'dual' need oneDNN)."""
    ok = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    return ("plain", "gemv", "onednn", "dual") if ok else ("plain", "gemv")


class Transformer:
    """Weights, RoPE tables and the static KV cache of one Llama-family model."""

    def __init__(
        self,
        args: ModelArgs,
        state: dict[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
        cpu_layout: str = "dual",
    ):
        self.args, self.device, self.dtype = args, device, dtype
        layout = cpu_layout if device.type == "cpu" else "plain"
        if layout not in cpu_layouts() + ("plain",):
            raise RefspecError(
                f"cpu_layout {cpu_layout!r} is not available here; use one of {', '.join(cpu_layouts())}"
            )

        def w(name: str) -> torch.Tensor:
            if name not in state:
                raise RefspecError(f"weights miss tensor {name!r}; the model folder is incomplete")
            return state[name].to(device=device, dtype=dtype)

        def lin(*names: str) -> Linear:
            return Linear(torch.cat([w(n) for n in names]).contiguous(), layout)

        def keep(name: str) -> torch.Tensor:
            # A copy: safetensors tensors may live in the file's mmap, which would stay mapped.
            return w(name).clone()

        tied = args.tied or "lm_head.weight" not in state
        self.lm_head = lin("model.embed_tokens.weight" if tied else "lm_head.weight")
        # A tied head's plain weight is the embedding table; its W^T copy serves as one too (a
        # strided row gather), so no layout keeps a third copy.
        head = self.lm_head
        if tied and head.plain is not None:
            self.embed = head.plain
        elif tied and head.gemv is not None:
            self.embed = head.gemv.t()
        else:
            self.embed = keep("model.embed_tokens.weight")
        self.norm = keep("model.norm.weight")
        self.layers = []
        for i in range(args.layers):
            p = f"model.layers.{i}."
            wq = _interleave(w(p + "self_attn.q_proj.weight"), args.heads)
            wk = _interleave(w(p + "self_attn.k_proj.weight"), args.kv_heads)
            self.layers.append(
                (
                    keep(p + "input_layernorm.weight"),
                    Linear(torch.cat([wq, wk, w(p + "self_attn.v_proj.weight")]).contiguous(), layout),
                    lin(p + "self_attn.o_proj.weight"),
                    keep(p + "post_attention_layernorm.weight"),
                    lin(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                    lin(p + "mlp.down_proj.weight"),
                )
            )
        # RoPE as complex rotations e^(i·pos·θ_j), computed in fp32 as HF does.
        inv = 1.0 / (
            args.rope_theta ** (torch.arange(0, args.head_dim, 2, dtype=torch.float32) / args.head_dim)
        )
        ang = torch.outer(torch.arange(args.max_positions, dtype=torch.float32), inv)
        self.rope = torch.polar(torch.ones_like(ang), ang).to(device)
        self.kv: torch.Tensor | None = None  # [layers, 2, B, H_kv, S_max, D]
        self.batch = 0

    @property
    def capacity(self) -> int:
        return 0 if self.kv is None else self.kv.shape[4]

    def setup_cache(self, batch: int, max_len: int) -> None:
        """Allocate (or grow) the static KV cache to at least max_len slots; contents are kept."""
        a = self.args
        if max_len > a.max_positions:
            raise RefspecError(
                f"context of {max_len} tokens exceeds the model's {a.max_positions} positions; "
                "shorten the prompt or max_new_tokens"
            )
        if self.kv is not None and self.batch == batch and self.capacity >= max_len:
            return
        size = min(a.max_positions, max(max_len, 2 * self.capacity, 256))
        # Zeros, not empty: a masked-out slot still enters P @ V with weight 0, and 0 * NaN = NaN.
        kv = torch.zeros(
            a.layers, 2, batch, a.kv_heads, size, a.head_dim, device=self.device, dtype=self.dtype
        )
        if self.kv is not None and self.batch == batch:
            kv[..., : self.capacity, :] = self.kv
        self.kv, self.batch = kv, batch

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor | int,
        mask: torch.Tensor | None,
        kv_len: int,
        logits_rows: slice | torch.Tensor | None = slice(None),
        head: bool = True,
        lanes: slice = slice(None),
    ) -> torch.Tensor | None:
        """Run rows through the model, writing their K/V into the cache; return logits.

        tokens: [B, R] token ids; positions: [R] RoPE positions; slots: [R] cache slots to write
        (or an int: the first of R consecutive slots); mask: [R, kv_len] bool, True where row r may
        attend to slot s (None: every row attends to all kv_len slots); kv_len: slots attended,
        0..kv_len-1, which must include the rows' own slots; logits_rows: which rows get logits
        (None: none, e.g. a prefill). Returns logits [B, rows, V] in fp32, or with head=False the
        final-norm hidden states [B, rows, hidden] those logits would come from.

        A batch of requests (batch.py): `lanes` are the cache rows the B rows of `tokens` use, and
        positions [B, R], slots [B, R] and mask [B, R, kv_len] give each lane its own.
        """
        a = self.args
        bsz, rows = tokens.shape
        hq, hk, d = a.heads, a.kv_heads, a.head_dim
        group = hq // hk
        with region("other"):
            x = F.embedding(tokens, self.embed).view(bsz * rows, a.hidden)
            rope = self.rope[positions].view(-1, rows, 1, d // 2)  # [1 or B, R, 1, d/2]
            if mask is not None:
                # One additive bias per forward, shared by every layer; the `group` query heads
                # of a KV head are stacked as rows (GQA without repeating K/V).
                bias = torch.zeros(mask.shape, device=self.device, dtype=self.dtype)
                bias.masked_fill_(~mask, float("-inf"))
                bias = bias.view(-1, 1, rows, kv_len).expand(-1, group, rows, kv_len)
                bias = bias.reshape(-1, 1, group * rows, kv_len)
        for i, (ln1, wqkv, wo, ln2, wgu, wdown) in enumerate(self.layers):
            with region("other"):
                h = rms_norm(x, ln1, a.rms_eps)
            with region("linear"):
                qkv = wqkv(h)
            with region("other"):
                qkv = qkv.view(bsz, rows, hq + 2 * hk, d)
                qk = qkv[:, :, : hq + hk]
                if qk.dtype != torch.float32:
                    qk = qk.float()
                qk = torch.view_as_real(torch.view_as_complex(qk.unflatten(-1, (-1, 2))) * rope)
                qk = qk.flatten(-2).to(self.dtype)
                kc, vc = self.kv[i, 0][lanes], self.kv[i, 1][lanes]  # views of the cache
                k, v = qk[:, :, hq:].transpose(1, 2), qkv[:, :, hq + hk :].transpose(1, 2)
                if isinstance(slots, int):
                    kc[:, :, slots : slots + rows] = k
                    vc[:, :, slots : slots + rows] = v
                elif slots.dim() == 1:
                    kc.index_copy_(2, slots, k)
                    vc.index_copy_(2, slots, v)
                else:  # each lane its own slots: indexed [B, R, H_kv, D]
                    lane = torch.arange(bsz, device=self.device)[:, None]
                    kc[lane, :, slots] = k.transpose(1, 2)
                    vc[lane, :, slots] = v.transpose(1, 2)
            with region("attention"):
                q = qk[:, :, :hq].reshape(bsz, rows, hk, group, d).permute(0, 2, 3, 1, 4)
                o = F.scaled_dot_product_attention(
                    q.reshape(bsz, hk, group * rows, d),
                    kc[:, :, :kv_len],
                    vc[:, :, :kv_len],
                    attn_mask=bias if mask is not None else None,
                )
                o = o.view(bsz, hk, group, rows, d).permute(0, 3, 1, 2, 4).reshape(bsz * rows, hq * d)
            with region("linear"):
                x = x + wo(o)
            with region("other"):
                h = rms_norm(x, ln2, a.rms_eps)
            with region("linear"):
                gu = wgu(h)
                gate, up = gu.split(a.intermediate, dim=-1)
                x = x + wdown(F.silu(gate) * up)
        if logits_rows is None:
            return None
        with region("lm_head"):
            x = x.view(bsz, rows, a.hidden)[:, logits_rows]
            n = x.shape[1]
            x = rms_norm(x.reshape(bsz * n, a.hidden), self.norm, a.rms_eps)
            if not head:
                return x.view(bsz, n, a.hidden)
            return self.lm_head(x).view(bsz, n, a.vocab).float()

    # -- what the engine calls (the same on CudaModel) ----------------------------------------------

    def prefill(self, tokens: list[int], start: int, lane: int | None = None) -> None:
        """Write the K/V of prompt tokens at slots start.. (causal, no logits), on cache row `lane`
        of a batch (None: the cache's only row)."""
        lanes = slice(None) if lane is None else slice(lane, lane + 1)
        for s in range(0, len(tokens), PREFILL_CHUNK):
            chunk = tokens[s : s + PREFILL_CHUNK]
            n, at = len(chunk), start + s
            mask = torch.ones(n, at + n, dtype=torch.bool, device=self.device)
            mask[:, at:] = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
            positions = torch.arange(at, at + n, device=self.device)
            tokens_t = torch.tensor([chunk], dtype=torch.long, device=self.device)
            self.forward(tokens_t, positions, at, mask, at + n, logits_rows=None, lanes=lanes)

    def verify(self, tokens: list[int], positions: list[int], start: int, mask: list[list[bool]] | None,
               head=None) -> list[int]:  # fmt: skip
        """Each row's argmax: rows at slots start.., RoPE `positions`, each attending every slot
        below start and the rows `mask` allows (None: causal); `head` replaces the LM head's argmax."""
        r = len(tokens)
        with region("other"):
            full = None  # one row attends every slot up to and including its own
            if r > 1:
                full = torch.ones(r, start + r, dtype=torch.bool, device=self.device)
                tail = (
                    torch.tensor(mask, dtype=torch.bool)
                    if mask is not None
                    else torch.ones(r, r, dtype=torch.bool).tril()
                )
                full[:, start:] = tail.to(self.device)
            rows = torch.tensor([tokens], dtype=torch.long, device=self.device)
            pos = torch.tensor(positions, device=self.device)
        if head is None:
            logits = self.forward(rows, pos, start, full, start + r)
            with region("other"):
                return logits[0].argmax(dim=-1).tolist()
        hidden = self.forward(rows, pos, start, full, start + r, head=False)
        with region("lm_head"):
            return head.argmax(hidden[0])

    def move_kv(self, src: list[int], dst: list[int], lane: int | None = None) -> None:
        """Copy the K/V of slots `src` to slots `dst` (a tree's accepted path, compacted), on cache
        row `lane` of a batch (None: every row)."""
        s = torch.tensor(src, device=self.device)
        d = torch.tensor(dst, device=self.device)
        kv = self.kv if lane is None else self.kv[:, :, lane : lane + 1]
        kv.index_copy_(4, d, kv.index_select(4, s))


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` = float32 on CPU, bfloat16 on CUDA; else float32 / bfloat16 / float16."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in table:
        raise RefspecError(f"unknown dtype {name!r}; use auto, float32, bfloat16 or float16")
    return table[name]


def load_weights(
    folder: Path, device: torch.device | None = None
) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """The model arguments and tensors of an HF Llama-family folder (config.json + *.safetensors);
    a synthetic folder's tensors are drawn on `device` (default the CPU), the same bits on any."""
    config = load_config(folder)
    try:
        args = ModelArgs.from_hf(config)
    except KeyError as e:
        raise RefspecError(f"{folder / 'config.json'} lacks {e}; give a complete HF Llama folder") from None
    except RefspecError as e:
        raise RefspecError(f"{folder / 'config.json'}: {e}") from None
    if MARK in config:
        return args, synthetic_state(config, device or torch.device("cpu"))
    return args, load_state_dict(folder)


def load_model(
    folder: Path, device: torch.device, dtype: torch.dtype, cpu_layout: str = "dual"
) -> Transformer:
    """The eager Transformer of an HF Llama-family folder."""
    return Transformer(*load_weights(folder, device), device, dtype, cpu_layout)
