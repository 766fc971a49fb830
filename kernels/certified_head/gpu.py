"""The Triton path: buffers, launches, CUDA-graph replay and the exact fallback.

Triton is imported only here (an optional dependency). On CPU tensors the same kernels run under
Triton's interpreter, which needs TRITON_INTERPRET=1 in the environment before Triton is first
imported (that is how the CPU tests check them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from .exact import err_factor, exact_logits, resolve_argmax
from .quant import QuantizedHead

# Programs per hidden row of the rescoring kernel (each strides over the row's survivors).
RESCORE_PROGRAMS = 128
# Flags written by the final kernel, one per hidden row.
OK, OVERFLOW, UNSURE, NONFINITE = 0, 1, 2, 3


@dataclass(frozen=True)
class KernelConfig:
    """Tile shape of the bounds kernel (the one that streams the int8 head)."""

    BN: int = 128
    BK: int = 256
    num_warps: int = 4
    num_stages: int = 3
    dot_acc: bool = False  # acc += tl.dot(a, b) (False) or tl.dot(a, b, acc): same integers, two lowerings


@dataclass
class Buffers:
    """Per-M device buffers; padded limb rows stay zero (they never contribute to a dot)."""

    M: int
    BM: int
    p1: torch.Tensor
    p2: torch.Tensor
    t: torch.Tensor
    nrm: torch.Tensor
    up: torch.Tensor
    lo: torch.Tensor
    bmax: torch.Tensor
    cnt: torch.Tensor
    idx: torch.Tensor
    z: torch.Tensor
    err: torch.Tensor
    out: torch.Tensor  # int64 [2, M]: argmax, then flag; one device-to-host copy reads both
    host: torch.Tensor  # its host copy (pinned memory when the head is on a GPU)
    graph: object | None = None
    x_static: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)


# Tiles of the bounds kernel by the largest M they serve, measured on an H200 (the tile sweep of
# `bench/certified_head.py gpu --sweep`, docs/BENCHMARKS.md); other GPUs run them correctly too.
TUNED = {16: KernelConfig(64, 256, 4, 4), 64: KernelConfig(128, 256, 4, 3)}


def _p2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class TritonHead:
    """Runs the certified head's five kernels for M = 1..64 hidden rows (CertifiedHead splits more)."""

    def __init__(
        self,
        head: QuantizedHead,
        cap: int = 4096,
        config: KernelConfig | None = None,
        configs: dict[int, KernelConfig] | None = None,
    ):
        if not head.q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("the Triton path needs CUDA tensors (or TRITON_INTERPRET=1 for the interpreter)")
        from . import triton_kernels  # noqa: PLC0415  (optional dependency)

        self.k = triton_kernels
        self.head = head
        self.cap = _p2(cap)
        self.config = config or KernelConfig()
        # An explicit `config` serves every M; otherwise `configs`, or the measured table.
        self.configs = dict(configs) if configs is not None else {} if config else dict(TUNED)
        self._bufs: dict[int, Buffers] = {}

    def config_for(self, M: int) -> KernelConfig:
        fits = [m for m in self.configs if m >= M]
        return self.configs[min(fits)] if fits else self.config

    def buffers(self, M: int) -> Buffers:
        if M not in self._bufs:
            V, H = self.head.q.shape
            dev = self.head.q.device
            BM = max(16, _p2(M))
            nb = -(-V // self.config_for(M).BN)
            f32 = dict(dtype=torch.float32, device=dev)
            f64 = dict(dtype=torch.float64, device=dev)
            self._bufs[M] = Buffers(
                M=M,
                BM=BM,
                p1=torch.zeros((BM, H), dtype=torch.int8, device=dev),
                p2=torch.zeros((BM, H), dtype=torch.int8, device=dev),
                t=torch.zeros((M, 2), **f32),
                nrm=torch.zeros((M, 2), **f32),
                up=torch.empty((M, V), **f32),
                lo=torch.empty((M, V), **f32),
                bmax=torch.empty((M, nb), **f32),
                cnt=torch.zeros(M, dtype=torch.int64, device=dev),
                idx=torch.zeros((M, self.cap), dtype=torch.int32, device=dev),
                z=torch.empty((M, self.cap), **f64),
                err=torch.empty((M, self.cap), **f64),
                out=torch.empty((2, M), dtype=torch.int64, device=dev),
                host=torch.empty((2, M), dtype=torch.int64, pin_memory=self.head.q.is_cuda),
            )
        return self._bufs[M]

    def launch(
        self, x: torch.Tensor, b: Buffers, write_lower: bool = False, bounds_only: bool = False
    ) -> None:
        """Enqueue the five kernels for x [M, H] (contiguous rows); no host synchronization.

        bounds_only: stop after the kernel that streams the int8 head (for benchmarks).
        """
        k, hd, cfg = self.k, self.head, self.config_for(b.M)
        V, H = hd.q.shape
        M = b.M
        nb = b.bmax.shape[1]
        # One chunk covers H <= 8192, so the three passes re-read h from L1 instead of waiting on HBM.
        blk = min(_p2(H), 8192)
        k.split_kernel[(M,)](
            x, x.stride(0), b.p1, b.p2, b.p1.stride(0), b.t, b.nrm, b.cnt, H, blk, -(-H // blk), num_warps=8
        )
        k.bounds_kernel[(nb,)](
            hd.q, hd.scale, hd.err_norm, hd.deq_norm, b.p1, b.p2, b.t, b.nrm, b.up, b.lo, b.bmax,
            M, V, H, nb, hd.q.stride(0), b.p1.stride(0), b.up.stride(0),
            BM=b.BM, BN=cfg.BN, BK=cfg.BK, EVEN_K=H % cfg.BK == 0, EVEN_N=V % cfg.BN == 0,
            WRITE_LO=write_lower, DOT_ACC=cfg.dot_acc, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        if bounds_only:
            return
        chunk = 4096
        k.select_kernel[(-(-V // chunk), M)](
            b.up, b.bmax, b.cnt, b.idx, V, nb, b.up.stride(0), self.cap, CHUNK=chunk, NB_P2=_p2(nb)
        )
        # Few survivors per CTA and wide K steps: the rescoring is latency-bound, not byte-bound.
        bs = 4
        k.rescore_kernel[(min(self.cap // bs, RESCORE_PROGRAMS), M)](
            hd.weight, x, b.idx, b.cnt, b.z, b.err, H, hd.weight.stride(0), x.stride(0), self.cap,
            err_factor(H), BS=bs, BKR=1024,
        )  # fmt: skip
        k.final_kernel[(M,)](b.z, b.err, b.idx, b.cnt, b.nrm, b.out, M, self.cap, CAP_P2=self.cap,
                             num_warps=max(4, min(16, self.cap // 256)))  # fmt: skip

    def capture(self, M: int, dtype: torch.dtype) -> Buffers:
        """Record the five launches for M rows in a CUDA graph (one replay per call afterwards)."""
        b = self.buffers(M)
        if b.graph is None or b.x_static.dtype != dtype:
            b.x_static = torch.zeros((M, self.head.hidden_size), dtype=dtype, device=self.head.q.device)
            b.x_static.normal_()
            self.launch(b.x_static, b)  # compiles and warms the kernels outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.launch(b.x_static, b)
            b.graph = graph
        return b

    def run(
        self, x: torch.Tensor, use_graph: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, Buffers, torch.Tensor]:
        """(argmax [M] int64 and survivors [M] int64 on the device, buffers, argmax on the host).

        One synchronization: the argmax and the flags come back in one copy; flagged rows are
        resolved exactly on the host."""
        x = x.contiguous()
        M = x.shape[0]
        if use_graph and x.is_cuda:
            b = self.capture(M, x.dtype)
            b.x_static.copy_(x)
            b.graph.replay()
            x = b.x_static
        else:
            b = self.buffers(M)
            self.launch(x, b)
        b.host.copy_(b.out, non_blocking=True)
        if b.out.is_cuda:
            torch.cuda.current_stream(b.out.device).synchronize()
        host_arg, flags = b.host[0].clone(), b.host[1].tolist()
        arg, cnt = b.out[0], b.cnt
        if any(flags):
            arg, cnt = arg.clone(), cnt.clone()
            for m, flag in enumerate(flags):
                if flag:
                    arg[m], cnt[m] = self._resolve_row(x, b, m, flag)
                    host_arg[m] = arg[m]
        return arg, cnt, b, host_arg

    def survivors(self, b: Buffers, m: int) -> torch.Tensor:
        """The survivor indices of row m (from the list, or recomputed when it overflowed)."""
        n = int(b.cnt[m])
        if n <= self.cap:
            return b.idx[m, :n].to(torch.int64)
        level = b.bmax[m].max()
        return (b.up[m] >= level).nonzero().flatten()

    def _resolve_row(self, x: torch.Tensor, b: Buffers, m: int, flag: int) -> tuple[int, int]:
        if flag == NONFINITE:
            if not bool(torch.isfinite(x[m]).all()):
                raise ValueError(
                    f"hidden row {m} contains inf or NaN; the certified head needs finite inputs"
                )
            # A finite row whose fp32 norm or bounds overflow prunes nothing: every row is a
            # candidate, scored in float64 (whose range holds any product of fp32 values).
            rows = torch.arange(self.head.weight.shape[0], device=self.head.weight.device)
            z, err = exact_logits(self.head.weight, x[m : m + 1], rows)
            return resolve_argmax(self.head.weight, x[m], rows, z[0], err[0]), rows.numel()
        rows = self.survivors(b, m)
        if flag == UNSURE:
            z, err = b.z[m, : rows.numel()], b.err[m, : rows.numel()]
        else:
            z, err = exact_logits(self.head.weight, x[m : m + 1], rows)
            z, err = z[0], err[0]
        return resolve_argmax(self.head.weight, x[m], rows, z, err), rows.numel()
