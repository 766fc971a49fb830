"""Tree verification of Gated DeltaNet layers without per-node snapshots (paper §4.2).

`reference` is the PyTorch definition (any device, fp32, tested in CI); `kernels` holds the Triton
kernels (CUDA): stock's chain verification with snapshots, the path, commit and WY kernels.
"""

from .layout import ROOT, GdnInputError, TreeLayout
from .reference import (
    bf16_ulp_error,
    chain,
    commit,
    path_verify,
    snapshot_bytes,
    wy_verify,
)

__all__ = [
    "ROOT",
    "GdnInputError",
    "TreeLayout",
    "bf16_ulp_error",
    "chain",
    "commit",
    "path_verify",
    "snapshot_bytes",
    "wy_verify",
]
