"""CPU kernel tests: Triton kernels run in its interpreter when there is no GPU.

TRITON_INTERPRET must be set before a kernel module is imported (triton.jit reads it then); the
W12 GEMM imports its kernels lazily, on first use, so setting it here is early enough — as long
as no test module imports triton while being collected before this folder (tests/gpu does so only
on a machine with CUDA, where the interpreter is not used).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
