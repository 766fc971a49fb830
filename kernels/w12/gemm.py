"""Launch the W12 GEMM y = x W^T (and the Q pass) for bf16 activations, fp32 accumulation.

Configs are a fixed function of (N, K, M) — never autotuned at run time — so a given shape always
runs the same kernel with the same split and the same reduction order: same bits every run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .format import TILE_K, TILE_N, W12FormatError, W12Tensor


@dataclass(frozen=True)
class GemmConfig:
    """block_n: rows of W per program (16..128); split: K splits (fixed-order partial sums);
    rpi: records per loop step (one dot over rpi * 64 columns); xa: x is the dot's operand A and
    the rebuilt W operand B (through shared memory), else W is operand A (registers)."""

    block_n: int = 128
    split: int = 1
    num_warps: int = 4
    num_stages: int = 3
    rpi: int = 1
    xa: bool = False
    maxnreg: int = 0  # a register cap (0: none): more resident programs, if nothing spills

    def __post_init__(self):
        bns = (16, 32, 64, 128) if self.xa else (64, 128)  # W as operand A needs 64-row wgmma tiles
        if self.block_n not in bns or self.split < 1 or self.rpi not in (1, 2):
            raise W12FormatError(f"bad W12 GemmConfig {self}: block_n in {bns}, split >= 1, rpi 1 or 2")


# Measured on the H200 (docs/BENCHMARKS.md, kernels/w12/NOTES.md): (N, K) -> {M: config}; a call
# with m rows takes the entry of the smallest listed M >= m. Shapes not listed use the rule below.
# Source: bench/results/w12_gemm_h200_2026-11-30_call4.json (graph-replay medians).
TUNED: dict[tuple[int, int], dict[int, GemmConfig]] = {
    (10240, 5120): {  # qkv of a 27B-class model
        1: GemmConfig(32, 2, 2, 5, rpi=1, xa=True),
        8: GemmConfig(32, 2, 2, 5, rpi=1, xa=True),
        16: GemmConfig(32, 2, 2, 3, rpi=2, xa=True),
        32: GemmConfig(64, 3, 4, 3, rpi=1, xa=True),
        48: GemmConfig(64, 3, 4, 3, rpi=2, xa=True),
        64: GemmConfig(64, 3, 4, 3, rpi=2, xa=True),
    },
    (5120, 8192): {  # o
        1: GemmConfig(64, 6, 4, 5, rpi=1, xa=True),
        8: GemmConfig(64, 6, 4, 5, rpi=1, xa=True),
        16: GemmConfig(64, 6, 4, 5, rpi=1, xa=True),
        32: GemmConfig(64, 3, 4, 5, rpi=1, xa=True),
        48: GemmConfig(64, 3, 4, 3, rpi=2, xa=True),
        64: GemmConfig(64, 3, 4, 3, rpi=2, xa=True),
    },
    (34816, 5120): {  # gate_up
        1: GemmConfig(128, 4, 4, 3, rpi=2, xa=True),
        8: GemmConfig(128, 3, 4, 5, rpi=1, xa=True),
        16: GemmConfig(128, 4, 4, 3, rpi=2, xa=True),
        32: GemmConfig(64, 1, 4, 3, rpi=1, xa=True, maxnreg=96),
        48: GemmConfig(128, 2, 4, 3, rpi=1, xa=True),
        64: GemmConfig(128, 2, 4, 3, rpi=1, xa=True),
    },
    (5120, 17408): {  # down
        1: GemmConfig(64, 4, 4, 5, rpi=1, xa=True),
        8: GemmConfig(64, 4, 4, 5, rpi=1, xa=True),
        16: GemmConfig(64, 4, 4, 3, rpi=2, xa=True),
        32: GemmConfig(64, 3, 4, 5, rpi=1, xa=True),
        48: GemmConfig(64, 4, 4, 3, rpi=1, xa=True),
        64: GemmConfig(64, 4, 4, 3, rpi=1, xa=True),
    },
}

SMS = 132  # H200 multiprocessors; the rule below aims at about four resident programs per SM


def block_m(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


def default_config(n: int, k: int, m: int) -> GemmConfig:
    """The tuned entry for (N, K) if there is one, else a fixed rule shaped like the tuned winners:
    x as operand A, 64-row blocks, K splits up to ~4 programs per SM (at most 4 splits above 16
    rows, where each split's partial costs traffic), at least 8 records per split."""
    table = TUNED.get((n, k), {})
    fits = [mm for mm in sorted(table) if mm >= m]
    if fits:
        return table[fits[0]]
    kt = -(-k // TILE_K)
    blocks = -(-n // 64)
    split = max(1, min(round(4 * SMS / blocks), max(kt // 8, 1), 4 if m > 16 else 8))
    return GemmConfig(block_n=64, split=split, num_warps=4, num_stages=4, rpi=1, xa=True)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def w12_matmul(
    x: torch.Tensor,
    t: W12Tensor,
    *,
    qpass: bool = False,
    config: GemmConfig | None = None,
    use_asm: bool | None = None,
    out_dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = x @ W^T with W in W12 (exact), or its Q pass (8-bit view, midpoint mantissa) if `qpass`.

    x: [..., K] bf16 on the W12 tensor's device (CUDA, or CPU under TRITON_INTERPRET=1). Returns
    [..., N] in `out_dtype` (default x's dtype; float32 shows the unrounded fp32 sums). `use_asm`
    defaults to the inline-PTX rebuild on a GPU. `bias` [N] is added to the fp32 sums before the
    output is rounded.
    """
    from . import gemm_kernels as gk  # imports triton: only where the GEMM runs

    if x.shape[-1] != t.k_in:
        raise W12FormatError(f"x has {x.shape[-1]} features, the W12 weight expects {t.k_in}")
    if x.dtype != torch.bfloat16:
        raise W12FormatError(f"the W12 GEMM takes bf16 activations, got {x.dtype}")
    if bias is not None and (bias.shape != (t.n_out,) or bias.device != x.device):
        raise W12FormatError(
            f"bias must be [{t.n_out}] on {x.device}, got {tuple(bias.shape)} on {bias.device}"
        )
    if t.n_raw:
        return _with_raw_rows(x, t, qpass, config, use_asm, out_dtype, bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, t.k_in)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, (n, k) = x2.shape[0], t.shape
    out = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*lead, n)
    cfg = config or default_config(n, k, m)
    if use_asm is None:
        use_asm = not interpreting()
    bm = block_m(m)
    kt = -(-k // TILE_K)
    ksplit = -(-kt // cfg.split)
    split = -(-kt // ksplit)  # drop empty splits
    grid = (-(-n // cfg.block_n), split, -(-m // bm))
    # split partials, then the escape sum (written by split 0)
    part = torch.empty(split + 1 if split > 1 else 0, m, n, dtype=torch.float32, device=x.device)
    args = (t.exps, t.esc_ptr, t.esc_col, t.esc_bits, t.exps if bias is None else bias)
    gk.w12_gemm_kernel[grid](
        t.records, x2, out, part, *args,
        m, n, k, kt, ksplit, x2.stride(0), out.stride(0),
        BN=cfg.block_n, BM=bm, FINISH=split == 1, HAS_BIAS=bias is not None, QPASS=qpass, USE_ASM=use_asm, NUM_STAGES=cfg.num_stages, DOT_F32=interpreting(),
        XA=cfg.xa, RPI=cfg.rpi,
        num_warps=cfg.num_warps,
        **({"maxnreg": cfg.maxnreg} if cfg.maxnreg and not interpreting() else {}),
    )  # fmt: skip
    if split > 1:
        rbn = 128
        gk.w12_reduce_kernel[(-(-n // rbn), -(-m // bm))](
            part,
            x2,
            out,
            *args,
            m,
            n,
            x2.stride(0),
            out.stride(0),
            BN=rbn,
            BM=bm,
            SPLIT=split,
            HAS_BIAS=bias is not None,
            num_warps=4,
        )
    return out.reshape(*lead, n)


def _with_raw_rows(x, t: W12Tensor, qpass, config, use_asm, out_dtype, bias) -> torch.Tensor:
    """A matrix with raw rows (format.py): the coded rows through the W12 kernel, the raw rows as an
    fp32-accumulated product of their exact bf16 weights (also in the Q pass), each rounded once."""
    dtype = out_dtype or x.dtype
    coded, raw = t.coded_rows(), t.raw_rows.long()
    out = torch.empty(*x.shape[:-1], t.n_out, dtype=dtype, device=x.device)
    if t.n_coded:
        b = None if bias is None else bias[coded]
        out[..., coded] = w12_matmul(x, t.coded(), qpass=qpass, config=config, use_asm=use_asm,
                                     out_dtype=dtype, bias=b)  # fmt: skip
    y = x.float() @ t.raw_bits.view(torch.bfloat16).float().t()
    if bias is not None:
        y += bias[raw].float()
    out[..., raw] = y.to(dtype)
    return out


def record_bytes_read(t: W12Tensor, qpass: bool = False) -> int:
    """Bytes of W12 weight one GEMM call streams (records, the view only for the Q pass; raw rows)."""
    per = (2 if qpass else 3) * TILE_N * TILE_K // 2
    return t.records.shape[0] * t.records.shape[1] * per + t.raw_bits.numel() * 2
