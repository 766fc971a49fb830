"""W12: a lossless 12-bit weight format for bf16 matrices, its codec and its GEMMs.

Public API:
    encode(w) -> W12Tensor, decode(t, qpass=False), verify(t, w)   (torch; CPU or CUDA)
    w12_matmul(x, t, qpass=False)   Triton GEMM y = x W^T (CUDA; CPU under TRITON_INTERPRET=1)
    reference_matmul(x, t, qpass=False)   the pure-torch reference path
    W12Linear, convert_model, set_qpass   the drop-in for nn.Linear layers

Triton is imported only by the GEMM, so the codec and the drop-in work without it on CPU.
"""

from .codec import decode, encode, verify
from .format import RECORD_BYTES, TILE_K, TILE_N, W12FormatError, W12Tensor
from .gemm import GemmConfig, default_config, w12_matmul
from .linear import W12Linear, convert_model, set_qpass
from .reference import exact_matmul_fp64, reference_matmul

__all__ = [
    "RECORD_BYTES",
    "TILE_K",
    "TILE_N",
    "GemmConfig",
    "W12FormatError",
    "W12Linear",
    "W12Tensor",
    "convert_model",
    "decode",
    "default_config",
    "encode",
    "exact_matmul_fp64",
    "reference_matmul",
    "set_qpass",
    "verify",
    "w12_matmul",
]
