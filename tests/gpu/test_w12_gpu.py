"""W12 on a CUDA GPU: the inline-PTX GEMM against fp64, against the plain rebuild bit for bit,
run-to-run determinism, the Q pass, the CUDA codec, and the drop-in. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
if torch.cuda.is_available():
    # Only with a GPU: importing triton before tests/kernels/conftest.py sets TRITON_INTERPRET
    # would leave triton.language's own jit functions unusable by the CPU interpreter tests.
    pytest.importorskip("triton")

from specpilot.kernels.w12 import (  # noqa: E402
    GemmConfig,
    W12Linear,
    W12Tensor,
    convert_model,
    decode,
    default_config,
    encode,
    exact_matmul_fp64,
    verify,
    w12_matmul,
)

DEV = "cuda"


def _weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    w = torch.randn(n, k, device=DEV, generator=g) * 0.02
    w = torch.where(torch.rand(n, k, device=DEV, generator=g) < 0.01, w * 8, w)
    w = w.to(torch.bfloat16)
    w[0, :7] = 0.0
    w[1, 3] = -0.0
    w[2, 5] = 1e-39
    w[3, 9] = 30.0
    w[5, k - 1] = -1e-12
    return w


def _rel(y, ref) -> float:
    return float((y.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize(("n", "k"), [(10240, 5120), (5120, 8192), (1000, 777)])
@pytest.mark.parametrize("m", [1, 8, 32, 48, 64, 100])
def test_gemm_vs_fp64_and_plain_rebuild(n, k, m):
    w = _weights(n, k, seed=m)
    t = encode(w)
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    ref = exact_matmul_fp64(x, w)
    y32 = w12_matmul(x, t, out_dtype=torch.float32)
    assert _rel(y32, ref) < 1e-5
    y = w12_matmul(x, t)
    assert _rel(y, ref) < 1e-2
    plain = w12_matmul(x, t, use_asm=False)
    assert torch.equal(plain.view(torch.int16), y.view(torch.int16))


VARIANTS = [
    GemmConfig(128, 1),
    GemmConfig(64, 3, rpi=2),
    GemmConfig(128, 4, 8, 4),
    GemmConfig(64, 2, 4, 3, rpi=1, xa=True),
    GemmConfig(128, 3, 8, 5, rpi=2, xa=True),
    GemmConfig(64, 1, 4, 3, rpi=1, xa=True, maxnreg=80),
]


@pytest.mark.parametrize("cfg", VARIANTS)
@pytest.mark.parametrize("m", [1, 32, 64])
def test_every_kernel_variant_vs_fp64_and_plain_rebuild(cfg, m):
    w = _weights(5120, 4160, seed=m)  # K = 65 records: an odd count for 2 records per step
    t = encode(w)
    x = torch.randn(m, 4160, device=DEV).to(torch.bfloat16)
    ref = exact_matmul_fp64(x, w)
    y32 = w12_matmul(x, t, config=cfg, out_dtype=torch.float32)
    assert _rel(y32, ref) < 1e-5
    y = w12_matmul(x, t, config=cfg)
    assert torch.equal(w12_matmul(x, t, config=cfg, use_asm=False).view(torch.int16), y.view(torch.int16))
    yq = w12_matmul(x, t, config=cfg, qpass=True, out_dtype=torch.float32)
    assert _rel(yq, exact_matmul_fp64(x, decode(t, qpass=True))) < 1e-5


@pytest.mark.parametrize("cfg", VARIANTS)
def test_same_bits_every_run(cfg):
    w = _weights(4096, 5120)
    t = encode(w)
    x = torch.randn(32, 5120, device=DEV).to(torch.bfloat16)
    first = w12_matmul(x, t, config=cfg).view(torch.int16).clone()
    for _ in range(5):
        out = torch.full_like(first, 12345)  # poison: every element must be rewritten
        out.copy_(w12_matmul(x, t, config=cfg).view(torch.int16))
        assert torch.equal(out, first)


def test_qpass_on_gpu_matches_its_reference():
    w = _weights(2048, 4096)
    t = encode(w)
    x = torch.randn(16, 4096, device=DEV).to(torch.bfloat16)
    yq = w12_matmul(x, t, qpass=True, out_dtype=torch.float32)
    assert _rel(yq, exact_matmul_fp64(x, decode(t, qpass=True))) < 1e-5
    plain = w12_matmul(x, t, qpass=True, use_asm=False, out_dtype=torch.float32)
    assert torch.equal(plain, yq)


def test_cuda_codec_equals_cpu_codec_and_round_trips():
    w = _weights(640, 1000)
    tg, tc = encode(w), encode(w.cpu())
    w[7, :200] = 3e30  # a raw row
    tg, tc = encode(w), encode(w.cpu())
    assert tc.raw_rows.tolist() == [7]
    for name in W12Tensor.PARTS:
        assert torch.equal(getattr(tg, name).cpu(), getattr(tc, name)), name
    verify(tg, w)


def test_raw_rows_in_a_cuda_graph():
    w = _weights(1024, 1024)
    w[3, :300] = float("inf")
    w[900, :300] = 3e30
    lin = W12Linear(w)
    assert lin.w12.raw_rows.tolist() == [3, 900]
    x = torch.randn(4, 1024, device=DEV).to(torch.bfloat16)
    want = lin(x).clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = lin(x)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


def test_dropin_on_gpu_runs_the_w12_gemm():
    torch.manual_seed(0)
    lin = torch.nn.Linear(1024, 3072, bias=True).to(DEV, torch.bfloat16)
    model = torch.nn.Sequential(lin)
    x = torch.randn(4, 1024, device=DEV).to(torch.bfloat16)
    ref = exact_matmul_fp64(x, lin.weight) + lin.bias.double()
    convert_model(model, skip=())
    assert _rel(model(x), ref) < 1e-2
    assert default_config(3072, 1024, 4).block_n in (64, 128)
