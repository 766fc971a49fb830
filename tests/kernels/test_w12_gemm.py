"""W12 GEMM on CPU: the Triton kernels through TRITON_INTERPRET=1, and the pure-torch reference path.

The interpreter runs the plain-integer rebuild (USE_ASM=False, the inline PTX needs a GPU); the
GPU tests in tests/gpu compare the two rebuilds bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from specpilot.kernels.w12 import (
    GemmConfig,
    decode,
    encode,
    exact_matmul_fp64,
    reference_matmul,
    w12_matmul,
)

from .w12_data import trained_like, with_specials

pytest.importorskip("triton")


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


@pytest.fixture(scope="module")
def case():
    """A matrix with ragged edges (N, K not tile multiples), zeros and every kind of finite escape."""
    torch.manual_seed(0)
    w = trained_like(230, 250, seed=3)
    w[0, :5] = 0.0
    w[1, 7] = -0.0
    w[2, 9] = 1e-39  # denormal
    w[3, 11] = 40.0  # far above the window
    w[4, 13] = -2e-12  # far below
    t = encode(w)
    assert t.n_escapes >= 3 and t.n_raw == 0
    return w, t


@pytest.mark.parametrize(
    ("m", "cfg"),
    [
        (1, GemmConfig(128, 1)),
        (3, GemmConfig(64, 2)),
        (17, GemmConfig(64, 3)),
        (33, GemmConfig(128, 2)),
        (70, GemmConfig(64, 1)),  # two row blocks of x
        (5, GemmConfig(64, 2, xa=True)),  # x as operand A, W as operand B
        (33, GemmConfig(128, 1, rpi=2, xa=True)),  # two records per loop step
        (2, GemmConfig(64, 2, rpi=2)),
        (4, GemmConfig(32, 1, 2, rpi=2, xa=True)),  # narrow blocks: a quarter of a record's rows
        (17, GemmConfig(16, 2, 2, xa=True)),
    ],
)
def test_gemm_matches_fp64_with_exact_products_and_fp32_sums(case, m, cfg):
    w, t = case
    x = torch.randn(m, w.shape[1]).bfloat16()
    ref = exact_matmul_fp64(x, w)
    y32 = w12_matmul(x, t, config=cfg, out_dtype=torch.float32)
    assert _rel(y32, ref) < 1e-5  # fp32 sums of exact products
    y = w12_matmul(x, t, config=cfg)
    assert y.dtype == torch.bfloat16 and y.shape == (m, w.shape[0])
    assert _rel(y, ref) < 1e-2  # bf16 output rounding
    assert torch.equal(w12_matmul(x, t, config=cfg).view(torch.int16), y.view(torch.int16))


def test_split_orders_are_fixed_and_all_close(case):
    w, t = case
    x = torch.randn(5, w.shape[1]).bfloat16()
    ys = [w12_matmul(x, t, config=GemmConfig(64, s), out_dtype=torch.float32) for s in (1, 2, 4)]
    ref = exact_matmul_fp64(x, w)
    for y in ys:
        assert _rel(y, ref) < 1e-5


def test_qpass_gemm_uses_the_8bit_view_with_midpoint_mantissa(case):
    w, t = case
    x = torch.randn(4, w.shape[1]).bfloat16()
    yq = w12_matmul(x, t, qpass=True, config=GemmConfig(128, 1), out_dtype=torch.float32)
    refq = exact_matmul_fp64(x, decode(t, qpass=True))
    assert _rel(yq, refq) < 1e-5
    # the Q pass is output-changing: near the exact product, never equal to it
    ref = exact_matmul_fp64(x, w)
    assert 1e-4 < _rel(yq, ref) < 5e-2


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # numpy, inside the interpreter
def test_inf_and_nan_weights_follow_ieee(case):
    w, _ = case
    w = with_specials(w, seed=5)
    t = encode(w)
    x = torch.randn(2, w.shape[1]).bfloat16()
    y = w12_matmul(x, t, config=GemmConfig(128, 1), out_dtype=torch.float32)
    ref = exact_matmul_fp64(x, w)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isinf(y), torch.isinf(ref))
    assert torch.equal(torch.sign(y[torch.isinf(y)]), torch.sign(ref[torch.isinf(ref)]).float())
    assert _rel(y[fin], ref[fin]) < 1e-5


def test_reference_path_matches_fp64(case):
    w, t = case
    x = torch.randn(6, w.shape[1]).bfloat16()
    assert _rel(reference_matmul(x, t), exact_matmul_fp64(x, w)) < 1e-2
    assert reference_matmul(x, t).dtype == torch.bfloat16


def test_bias_is_added_before_the_single_rounding(case):
    w, t = case
    x = torch.randn(3, w.shape[1]).bfloat16()
    b = torch.randn(w.shape[0]).bfloat16()
    ref = exact_matmul_fp64(x, w) + b.double()
    for cfg in (GemmConfig(128, 1), GemmConfig(64, 2)):
        assert _rel(w12_matmul(x, t, config=cfg, bias=b, out_dtype=torch.float32), ref) < 1e-5


@pytest.mark.filterwarnings("ignore:overflow encountered")  # numpy, inside the interpreter
def test_outputs_are_finite_within_the_documented_range():
    """format.py's bound: finite wherever sum |w x| < 2^(E_n + 1) (1 - K 2^-23). Weights near 1e-9
    and activations near 1e37 put rows on both sides of it."""
    g = torch.Generator().manual_seed(8)
    w = (trained_like(128, 256, seed=8).float() * 1e-7).bfloat16()
    x = (torch.randn(4, 256, generator=g).clamp(-3, 3) * torch.logspace(35, 38, 4)[:, None]).bfloat16()
    w = torch.where(w.abs() < 2e-9, 2e-9, w)  # the tail in every row's window: no escapes
    t = encode(w)
    assert t.n_escapes == 0 and t.n_raw == 0
    y = w12_matmul(x, t, config=GemmConfig(64, 2), out_dtype=torch.float32)
    s = x.double().abs() @ w.double().abs().t()  # [M, N]
    limit = torch.exp2(t.exps.double() + 1) * (1 - 256 * 2.0**-23)
    inside = s < limit[None, :]
    assert bool(inside.any()) and not bool(inside.all())
    assert bool(torch.isfinite(y[inside]).all())
    ref = exact_matmul_fp64(x, w)
    assert bool(((y.double() - ref).abs() <= 1e-5 * s)[inside].all())


def test_raw_rows_are_multiplied_beside_the_coded_ones():
    w = trained_like(256, 200, seed=4)
    w[5, :40] = 3e30  # 40 of 200 weights outside the window: the row is stored raw
    w[77] = float("nan")
    t = encode(w)
    assert t.raw_rows.tolist() == [5, 77]
    x = torch.randn(3, 200).bfloat16()
    b = torch.randn(256).bfloat16()
    ref = exact_matmul_fp64(x, w) + b.double()
    y = w12_matmul(x, t, config=GemmConfig(64, 2), bias=b, out_dtype=torch.float32)
    assert torch.isnan(y[:, 77]).all() and not torch.isnan(y[:, :77]).any()
    fin = torch.isfinite(ref)
    assert _rel(y[fin], ref[fin]) < 1e-5
    y0 = w12_matmul(x, t, out_dtype=torch.float32)
    q = w12_matmul(x, t, qpass=True, out_dtype=torch.float32)  # raw rows stay exact in the Q pass
    assert torch.equal(q[:, 5], y0[:, 5]) and not torch.equal(q[:, :5], y0[:, :5])


@pytest.mark.parametrize("cfg", [GemmConfig(64, 2, rpi=2), GemmConfig(128, 2, rpi=2, xa=True)])
def test_two_records_per_step_with_an_odd_record_count(cfg):
    w = trained_like(130, 330, seed=9)  # 6 records per row; split 2 -> 3 per split: one step half empty
    t = encode(w)
    x = torch.randn(3, 330).bfloat16()
    assert _rel(w12_matmul(x, t, config=cfg, out_dtype=torch.float32), exact_matmul_fp64(x, w)) < 1e-5
