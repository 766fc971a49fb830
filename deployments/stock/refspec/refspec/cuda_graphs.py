"""refspec on CUDA: one persistent pass (cuda_persist.py) captured as one CUDA graph per row bucket.

`CudaModel` holds the weights in the kernels' layout (bf16, HF's rotate-half Q/K rows), the static
KV cache `[layers, kv_heads, slots, head_dim]` (K and V apart) and static input buffers. A pass of
R rows runs in the graph of the bucket ceil(R / 16) · 16, the rows past R being padding that sees
only itself. Every kernel computes a row in 16-row tiles, so a row's logits are the same bits
whatever the bucket: a verified chain row equals the AR step at the same prefix, as on an exact
pass. The host copies one packed int32 buffer in (tokens, positions, start, mask rows), replays the
graph and copies the argmax out; nothing else crosses per step. The graph holds the copies too:
[input copy, zero the barrier counter, the persistent kernel, output copy], one replay per step.
With `eager` (profiling, the interpreter, the tests' reference) the pass is the per-phase kernels
of cuda_kernels.py launched one by one: the same tile functions, so the same bits.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import triton
from triton.runtime.errors import OutOfResources

from . import cuda_kernels as K
from . import cuda_persist
from .errors import RefspecError
from .model import PREFILL_CHUNK, ModelArgs

BM = 16  # rows per tile in every kernel (and the bucket step)
ROWS = PREFILL_CHUNK  # the most rows of a pass: a prefill chunk, or a verification pass's bucket
# Tile shapes and launch settings: fixed, so a shape always runs the same reduction order (the
# per-phase kernels and the persistent pass share them, hence the same bits). Picked by timing the
# persistent pass's variants on an H200 (bench/refspec_floor.py --sweep, issue 40): K tiles of 64-128,
# split-KV attention over 64-slot splits, 4 pipeline stages.
QKV = {"BH": 16, "BK": 64, "num_warps": 4, "num_stages": 4}
# SPL: slots per split of split-KV attention (0: one program per head walks every slot).
ATTN = {"BN": 64, "SPL": 64, "num_warps": 4, "num_stages": 3}  # 4 warps: the persistent pass's
LIN_O = {"BN": 16, "BK": 64, "num_warps": 4, "num_stages": 3}
LIN_DOWN = {"BN": 16, "BK": 128, "num_warps": 4, "num_stages": 3}
GATE_UP = {"BN": 16, "BK": 64, "num_warps": 4, "num_stages": 3}
HEAD = {"BN": 128, "BK": 64, "num_warps": 4, "num_stages": 2}
# The persistent pass (one program of 4 warps per SM) is for latency-bound models; where a layer's
# weights pass this many bytes the per-phase kernels' grids, several programs per SM, keep more
# loads in flight and the pass is the per-phase kernels captured in the graph instead. Measured on
# an H200 (bench/refspec_floor.py): SmolLM2-135M, 7 MB a layer, persistent 0.70 ms a pass against
# per-phase 0.93; the paper's 27B layer shapes (wide27b-8l), 724 MB a layer, 5.63 against 3.37.
PERSIST_MAX_LAYER_BYTES = 64 << 20
# Such a model's per-phase tiles (the rest as above): wider rows a program, longer K tiles (a sweep
# of wide27b-8l's pass on an H100, bench/refspec_wide.py: 3.37 ms against 3.75 with the tiles above);
# a graph's split-KV grid has ATTN_GRAPH_SPLITS programs a head, each taking every
# ATTN_GRAPH_SPLITS-th split of the pass's context (a grid sized for the whole cache ran empty programs).
READ_BOUND = {"LIN_O": {"BN": 32, "BK": 128}, "GATE_UP": {"BN": 32, "BK": 128},
              "LIN_DOWN": {"BN": 32, "BK": 128}, "HEAD": {"BK": 128}}  # fmt: skip
ATTN_GRAPH_SPLITS = 8
# The persistent pass: the same tiles, one launch of 4 warps per SM.
PERSIST = {"QBH": QKV["BH"], "QBK": QKV["BK"], "ABN": ATTN["BN"], "OBN": LIN_O["BN"], "OBK": LIN_O["BK"],
           "GBN": GATE_UP["BN"], "GBK": GATE_UP["BK"], "DBN": LIN_DOWN["BN"], "DBK": LIN_DOWN["BK"],
           "HBN": HEAD["BN"], "HBK": HEAD["BK"], "ASPL": ATTN["SPL"], "num_warps": 4, "num_stages": 4}  # fmt: skip


def bucket(rows: int) -> int:
    return -(-rows // BM) * BM


class CudaModel:
    """Weights, KV cache and per-bucket CUDA graphs of one Llama-family model on one GPU."""

    # The kernels a pass launches (cuda_kernels.py), by the class whose bytes dominate them: the
    # profile's kernel classes (profile.py). A subclass launching its own kernels names them too.
    KERNEL_CLASS = {"norm_qkv_rope": "linear", "linear_residual": "linear", "norm_gate_up": "linear",
                    "attention": "attention", "attention_split": "attention", "norm_head": "lm_head",
                    "argmax_reduce": "lm_head"}  # fmt: skip

    def __init__(
        self, args: ModelArgs, state: dict[str, torch.Tensor], device: torch.device, max_context: int
    ):
        a = self.args = args
        self.device, self.dtype = device, torch.bfloat16
        if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
            name = torch.cuda.get_device_name(device)
            raise RefspecError(f"the CUDA path needs compute capability 8.0 or newer (bf16 tensor cores); "
                               f"{name} has {torch.cuda.get_device_capability(device)}; run on a CPU slot")  # fmt: skip
        if a.head_dim % 32 or a.hidden % 64 or a.heads % a.kv_heads:
            raise RefspecError(
                f"the CUDA kernels need head_dim % 32 == 0, hidden % 64 == 0 and heads % kv_heads == 0; "
                f"this model has {a.head_dim}, {a.hidden}, {a.heads}/{a.kv_heads}; run it on a CPU slot"
            )

        q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
        layer_bytes = 2 * a.hidden * (q + 2 * kv + q + 3 * a.intermediate)
        self.persistent = layer_bytes <= PERSIST_MAX_LAYER_BYTES  # else the graphs hold the per-phase kernels
        # The per-phase kernels' tiles: the persistent pass's, or READ_BOUND's where it does not run
        self.cfg = {n: d | ({} if self.persistent else READ_BOUND.get(n, {}))
                    for n, d in (("QKV", QKV), ("ATTN", ATTN), ("LIN_O", LIN_O), ("LIN_DOWN", LIN_DOWN),
                                 ("GATE_UP", GATE_UP), ("HEAD", HEAD))}  # fmt: skip
        if a.intermediate % self.cfg["GATE_UP"]["BN"] or a.hidden % self.cfg["LIN_O"]["BN"]:
            raise RefspecError(f"the CUDA kernels' tiles {self.cfg} do not divide hidden {a.hidden} and "
                               f"intermediate {a.intermediate}; run this model on a CPU slot")  # fmt: skip

        def w(name: str) -> torch.Tensor:
            if name not in state:
                raise RefspecError(f"weights miss tensor {name!r}; the model folder is incomplete")
            return state[name].to(device=device, dtype=torch.bfloat16).contiguous()

        self.embed = w("model.embed_tokens.weight")
        self.head = self.embed if (a.tied or "lm_head.weight" not in state) else w("lm_head.weight")
        self.norm = w("model.norm.weight")
        # The persistent pass reads each weight kind as one [layers, ...] tensor; `layers` holds views
        # of those (a mechanism that swaps `layers` gets its own stacks, see `stacked`). Each layer
        # is copied into the stacks as it is read, so loading holds the weights once plus one layer.
        stacks: tuple[torch.Tensor, ...] = ()
        for i in range(a.layers):
            p = f"model.layers.{i}."
            qkv = torch.cat([w(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
            gate_up = torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")])
            layer = (w(p + "input_layernorm.weight"), qkv, w(p + "self_attn.o_proj.weight"),
                     w(p + "post_attention_layernorm.weight"), gate_up, w(p + "mlp.down_proj.weight"))  # fmt: skip
            if not stacks:
                stacks = tuple(torch.empty((a.layers, *t.shape), dtype=t.dtype, device=device) for t in layer)
            for stack, t in zip(stacks, layer, strict=True):
                if t.shape != stack.shape[1:]:
                    raise RefspecError(f"layer {i}'s weights have shape {tuple(t.shape)} where layer 0's "
                                       f"have {tuple(stack.shape[1:])}; the model folder is inconsistent")  # fmt: skip
                stack[i].copy_(t)
            del qkv, gate_up, layer
        self.layers = [tuple(s[i] for s in stacks) for i in range(a.layers)]
        self._stack_cache = (self.layers, self._key(), stacks)
        half = a.head_dim // 2
        inv = 1.0 / (a.rope_theta ** (torch.arange(0, a.head_dim, 2, dtype=torch.float32) / a.head_dim))
        ang = torch.outer(torch.arange(a.max_positions, dtype=torch.float32), inv)
        self.cos, self.sin = ang.cos().to(device).contiguous(), ang.sin().to(device).contiguous()
        assert self.cos.shape[1] == half
        self.rmax = rmax = ROWS
        self.slots = min(a.max_positions, max_context) + rmax
        kv = (a.layers, a.kv_heads, self.slots, a.head_dim)
        # Zeros, not empty: a masked slot still enters P·V with weight 0, and 0 · NaN = NaN.
        self.kc = torch.zeros(kv, device=device, dtype=torch.bfloat16)
        self.vc = torch.zeros(kv, device=device, dtype=torch.bfloat16)
        # One packed int32 input buffer: tokens | positions | start | mask [rmax, rmax].
        self._n_in = 2 * rmax + 1 + rmax * rmax
        pin = device.type == "cuda"  # (a CPU device runs the kernels under TRITON_INTERPRET, for tests)
        self.inp_host = torch.zeros(self._n_in, dtype=torch.int32, pin_memory=pin)
        self.inp_np = self.inp_host.numpy()
        self.inp = torch.zeros(self._n_in, dtype=torch.int32, device=device)
        self.tokens, self.posn = self.inp[:rmax], self.inp[rmax : 2 * rmax]
        self.start = self.inp[2 * rmax : 2 * rmax + 1]
        self.mask = self.inp[2 * rmax + 1 :].view(rmax, rmax)
        hq = a.heads * a.head_dim
        self.x = torch.zeros(rmax, a.hidden, device=device, dtype=torch.bfloat16)
        self.q = torch.zeros(rmax, hq, device=device, dtype=torch.bfloat16)
        self.o = torch.zeros(rmax, hq, device=device, dtype=torch.bfloat16)
        self.h = torch.zeros(rmax, a.intermediate, device=device, dtype=torch.bfloat16)
        self.tiles = triton.cdiv(a.vocab, self.cfg["HEAD"]["BN"])
        self.vals = torch.zeros(rmax, self.tiles, device=device, dtype=torch.float32)
        self.idxs = torch.zeros(rmax, self.tiles, device=device, dtype=torch.int32)
        self.out = torch.zeros(rmax, device=device, dtype=torch.int64)
        self.out_host = torch.zeros(rmax, dtype=torch.int64, pin_memory=pin)
        self.out_np = self.out_host.numpy()
        self.hid = torch.zeros(rmax, a.hidden, device=device, dtype=torch.bfloat16)  # for a head mechanism
        self.bar = torch.zeros(1, device=device, dtype=torch.int32)  # the persistent pass's barrier counter
        # Split-KV attention's scratch: per (head, split of >= 64 slots, row) max, sum and P·V; a counter
        # per (head, row block).
        self.maxs = triton.cdiv(self.slots, 64)
        self.pm = torch.zeros(a.heads * self.maxs * rmax, device=device, dtype=torch.float32)
        self.pl = torch.zeros_like(self.pm)
        self.pacc = torch.zeros(a.heads * self.maxs * rmax * a.head_dim, device=device, dtype=torch.float32)
        self.acnt = torch.zeros(a.heads * rmax // BM, device=device, dtype=torch.int32)
        self.start_host = 0  # the pass's start, for the per-phase path's split-KV grid
        self.qk_scale = 1.4426950408889634 / math.sqrt(a.head_dim)
        cuda = device.type == "cuda"
        self.nprog = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 1
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self._masks: dict[tuple[int, int], np.ndarray] = {}  # (rows, bucket) -> a chain's mask rows
        self.eager = not cuda  # True: launch the per-phase kernels one by one (profiling; interpreter)
        self.timing: list | None = None  # a list: verify appends (start, end) CUDA events of each pass

    def _key(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for layer in self.layers for t in layer)

    def stacked(self) -> tuple[torch.Tensor, ...]:
        """(ln1, wqkv, wo, ln2, wgu, wd), each [layers, ...]: the storage of `layers`' views, or copies
        made once for these layers (a shallow copy that swaps `layers` gets its own; the cache holds
        the layers it was made from, so their addresses cannot be reused by other tensors)."""
        layers, key, stacks = self._stack_cache
        if layers is not self.layers or key != self._key():
            stacks = tuple(torch.stack([layer[j] for layer in self.layers]) for j in range(6))
            self._stack_cache = (self.layers, self._key(), stacks)
        return stacks

    @property
    def capacity(self) -> int:
        return self.slots - self.rmax

    def setup_cache(self, batch: int, max_len: int) -> None:
        """The cache is static on CUDA (graphs hold its address): check that a request fits."""
        if batch != 1 or max_len > self.capacity:
            raise RefspecError(
                f"a request of {max_len} tokens does not fit the CUDA cache of {self.capacity} slots; "
                "raise runtime.max_context in refspec.toml or shorten the request"
            )

    # -- the pass ----------------------------------------------------------------------------------

    def _layers(self, rows: int, splits: int | None = None) -> None:
        """The per-phase kernels of every layer; split-KV attention with `splits` programs a head (None:
        one a split of the pass's context; a graph passes ATTN_GRAPH_SPLITS, each taking every n-th).
        Each weight's kernel is launched by a method of its own (`_qkv`, `_linear`, `_gate_up`,
        `_head`), the seam where a mechanism that stores weights otherwise plugs in."""
        c = self.cfg
        splits = splits or triton.cdiv(self.start_host + rows, c["ATTN"]["SPL"] or 1)
        torch.index_select(self.embed, 0, self.tokens[:rows], out=self.x[:rows])
        for i, (ln1, wqkv, wo, ln2, wgu, wd) in enumerate(self.layers):
            self._qkv(i, rows, ln1, wqkv)
            self._attention(i, rows, splits)
            self._linear(rows, self.o, wo, c["LIN_O"])
            self._gate_up(rows, ln2, wgu)
            self._linear(rows, self.h, wd, c["LIN_DOWN"])

    def _qkv(self, i: int, rows: int, ln1: torch.Tensor, w: torch.Tensor) -> None:
        a, QKV = self.args, self.cfg["QKV"]
        K.norm_qkv_rope[(a.heads + 2 * a.kv_heads, a.head_dim // 2 // QKV["BH"], triton.cdiv(rows, BM))](
            self.x, ln1, w, self.cos, self.sin, self.posn, self.start, self.q, self.kc[i], self.vc[i], rows,
            a.rms_eps, self.slots, HQ=a.heads, HK=a.kv_heads, D=a.head_dim, K=a.hidden, BM=BM, **QKV)  # fmt: skip

    def _attention(self, i: int, rows: int, splits: int) -> None:
        a, ATTN, grid_m = self.args, self.cfg["ATTN"], triton.cdiv(rows, BM)
        group = a.heads // a.kv_heads
        if ATTN["SPL"]:
            K.attention_split[(a.heads, splits, grid_m)](
                self.q, self.kc[i], self.vc[i], self.mask, self.start, self.o, self.pm, self.pl, self.pacc,
                self.acnt, rows, self.rmax, self.slots, self.maxs, self.rmax, self.qk_scale, HQ=a.heads,
                GROUP=group, D=a.head_dim, BM=BM, **ATTN)  # fmt: skip
        else:
            K.attention[(a.heads, grid_m)](
                self.q, self.kc[i], self.vc[i], self.mask, self.start, self.o, rows, self.rmax, self.slots,
                self.qk_scale, HQ=a.heads, GROUP=group, D=a.head_dim, BM=BM, BN=ATTN["BN"],
                num_warps=ATTN["num_warps"], num_stages=ATTN["num_stages"])  # fmt: skip

    def _linear(self, rows: int, inp: torch.Tensor, w: torch.Tensor, cfg: dict) -> None:
        """x += inp · wᵀ (o_proj: inp = o; down_proj: inp = h)."""
        n, k = self.args.hidden, inp.shape[1]
        K.linear_residual[(n // cfg["BN"], triton.cdiv(rows, BM))](
            inp, w, self.x, rows, N=n, K=k, BM=BM, **cfg
        )

    def _gate_up(self, rows: int, ln2: torch.Tensor, w: torch.Tensor) -> None:
        a, GATE_UP = self.args, self.cfg["GATE_UP"]
        K.norm_gate_up[(a.intermediate // GATE_UP["BN"], triton.cdiv(rows, BM))](
            self.x, ln2, w, self.h, rows, a.rms_eps, INTER=a.intermediate, K=a.hidden, BM=BM, **GATE_UP
        )

    def _head(self, rows: int) -> None:
        """Each row's argmax into `out`: the head's tiles, then the reduction over them."""
        a = self.args
        K.norm_head[(self.tiles, triton.cdiv(rows, BM))](
            self.x, self.norm, self.head, self.vals, self.idxs, rows, a.rms_eps, a.vocab, self.tiles,
            K=a.hidden, BM=BM, **self.cfg["HEAD"])  # fmt: skip
        K.argmax_reduce[(rows,)](
            self.vals, self.idxs, self.out, self.tiles, BT=triton.next_power_of_2(self.tiles)
        )

    def _pass(self, rows: int, hidden: bool) -> None:
        """The whole verification pass: layers, then each row's argmax in `out` (or, for a head
        mechanism, the final-norm hidden states in `hid`). Persistent unless `eager` or a read-bound
        model (`persistent` False: the per-phase kernels, split-KV over ATTN_GRAPH_SPLITS programs a head)."""
        a = self.args
        persistent = self.persistent and not self.eager
        if persistent:
            self.bar.zero_()
            try:
                cuda_persist.launch(self, rows, not hidden, PERSIST)
            except OutOfResources as e:
                raise RefspecError(f"the persistent pass does not fit one program per SM ({e}); "
                                   "lower PERSIST's num_stages in refspec/cuda_graphs.py") from None  # fmt: skip
        else:
            self._layers(rows, None if self.eager else ATTN_GRAPH_SPLITS)
        if hidden:  # HF's RMSNorm, op for op
            x = self.x[:rows].float()
            self.hid[:rows] = (
                self.norm * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + a.rms_eps)).bfloat16()
            )
            return
        if not persistent:  # (the persistent pass ended with the head and the argmax)
            self._head(rows)

    def capture(self, rows: int, hidden: bool = False) -> None:
        """Capture the pass of a bucket as a CUDA graph (run once eagerly first: Triton compiles there)."""
        n = bucket(rows)
        if (n, hidden) in self.graphs:
            return
        if n > self.rmax:
            raise RefspecError(
                f"a pass of {rows} rows exceeds the CUDA path's {self.rmax} rows; verify fewer nodes"
            )
        # The warm-up launch writes K/V at slots start..: point it at the scratch slots past the
        # capacity, so a capture in the middle of a request leaves the cache as it was.
        host, rmax = self.inp_np, self.rmax
        host[:] = 0
        host[2 * rmax] = self.capacity
        host[2 * rmax + 1 :].reshape(rmax, rmax)[range(n), range(n)] = 1
        used = 2 * rmax + 1 + n * rmax

        def body() -> None:
            self.inp[:used].copy_(self.inp_host[:used], non_blocking=True)
            self._pass(n, hidden)
            if not hidden:
                self.out_host[:n].copy_(self.out[:n], non_blocking=True)

        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(stream):
                body()
            stream.synchronize()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                body()
        except torch.cuda.OutOfMemoryError:
            raise RefspecError(
                f"out of GPU memory while capturing the {n}-row graph; free the GPU or lower runtime.max_context"
            ) from None
        torch.cuda.synchronize(self.device)
        self.graphs[(n, hidden)] = graph

    def verify(self, tokens: list[int], positions: list[int], start: int, mask: list[list[bool]] | None,
               head=None) -> list[int]:  # fmt: skip
        """Each row's argmax: rows at slots start.., RoPE `positions`, tail `mask` (None: causal);
        `head` (a mechanism's) replaces the LM head's argmax over the final-norm hidden states."""
        r = len(tokens)
        n = bucket(r)
        if start + n > self.slots:
            raise RefspecError(f"context of {start + r} tokens exceeds the cache's {self.capacity} slots; "
                               "raise runtime.max_context")  # fmt: skip
        graphs, hidden = not self.eager, head is not None
        if graphs:
            self.capture(n, hidden)
        rmax, host = self.rmax, self.inp_np
        host[:r] = tokens
        host[r:n] = 0
        host[rmax : rmax + r] = positions
        host[rmax + r : rmax + n] = positions[-1]
        host[2 * rmax] = start
        self.start_host = start
        m = host[2 * rmax + 1 : 2 * rmax + 1 + n * rmax].reshape(n, rmax)
        if mask is None:  # a chain: the causal rows of (r, n), made once
            if (r, n) not in self._masks:
                c = np.zeros((n, rmax), dtype=np.int32)
                c[:r, :r] = np.tril(np.ones((r, r), dtype=np.int32))
                c[range(r, n), range(r, n)] = 1  # padding rows see only themselves
                self._masks[(r, n)] = c
            m[:] = self._masks[(r, n)]
        else:
            m[:] = 0
            m[:r, :r] = np.asarray(mask, dtype=np.int32)
            m[range(r, n), range(r, n)] = 1  # padding rows see only themselves
        timing = self.timing is not None and graphs
        if timing:
            ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev[0].record()
        if graphs:  # input copy, pass, output copy: one replay
            self.graphs[(n, hidden)].replay()
        else:
            used = 2 * rmax + 1 + n * rmax
            self.inp[:used].copy_(self.inp_host[:used], non_blocking=True)
            self._pass(n, hidden)
        if timing:
            ev[1].record()
            self.timing.append(ev)
        if hidden:
            return head.argmax(self.hid[:r])
        if self.device.type != "cuda":
            return self.out[:r].tolist()
        if not graphs:
            self.out_host[:r].copy_(self.out[:r], non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return self.out_np[:r].tolist()

    def prefill(self, tokens: list[int], start: int) -> None:
        """Write the K/V of prompt tokens at slots start.. (eager launches, causal, no logits)."""
        for s in range(0, len(tokens), PREFILL_CHUNK):
            chunk = tokens[s : s + PREFILL_CHUNK]
            r, at = len(chunk), start + s
            if at + r > self.slots:
                raise RefspecError(f"context of {at + r} tokens exceeds the cache's {self.capacity} slots")
            self.tokens[:r].copy_(torch.tensor(chunk, dtype=torch.int32))
            self.posn[:r].copy_(torch.arange(at, at + r, dtype=torch.int32))
            self.start.fill_(at)
            self.start_host = at
            self.mask[:r, :r] = torch.ones(r, r, dtype=torch.int32, device=self.device).tril()
            self._layers(r)

    def move_kv(self, src: list[int], dst: list[int]) -> None:
        """Copy the K/V of slots `src` to slots `dst` (a tree's accepted path, compacted)."""
        s = torch.tensor(src, device=self.device)
        d = torch.tensor(dst, device=self.device)
        for cache in (self.kc, self.vc):
            cache.index_copy_(2, d, cache.index_select(2, s))
