"""The refspec-w12 entry on refspec's CUDA path: W12 tiles are the bf16 tiles bit for bit, escaped
slots +0 (both rebuilds), the escapes added after the K loop; a pass that reads W12 records is
stock's up to the order of its fp32 sums.

Not bit for bit: the escapes' products are added after the tile's dot, and even with every weight
in the tile, stock's dot reads its tile from a (pipelined) load and W12's from registers, which
Triton lowers to tensor-core sequences that sum in another order (bench/w12_tile_ladder.py, H100:
bf16 weights routed through registers differ from the loaded kernel's fp32 sums in 514,323 of
557,056 outputs). Hence here: a GEMV within fp32 summation error of the exact sum, hidden states and
K/V within bf16 rounding of stock's, the argmax equal wherever stock's top two logits are not
near-tied, the PTX and plain-Triton rebuilds bit for bit the same pass, and W12's own spec decoding
equal to its AR.

The target is wide-h200's synthetic model cut to two layers and a 4096-token vocabulary (drawn on
the GPU): its layers are read-bound, so stock runs the per-phase kernels the entry replaces.
Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from specpilot.kernels.w12.tiles import tile_bits, tile_weight, with_escapes

from ..kernels.w12_data import trained_like, with_specials
from ..refspec.tree_entry import checkout_entry, engine_for, import_tree

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
CUDA = torch.device("cuda")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _specials(n: int, k: int) -> torch.Tensor:
    w = with_specials(trained_like(n, k, seed=n + k), seed=1)
    w[0, :4] = torch.tensor([0.0, -0.0, 1e-39, -3e-20])
    return w.to(CUDA)


@pytest.mark.parametrize("asm", [True, False], ids=["ptx", "triton"])
@pytest.mark.parametrize(("bn", "bk"), [(16, 64), (32, 128), (128, 128), (128, 64)])
@pytest.mark.parametrize(("n", "k"), [(384, 512), (300, 320)])
def test_triton_tiles_are_the_bf16_tiles(n, k, bn, bk, asm):
    """Zeros of both signs, denormals, inf, NaN payloads, far outliers, ragged edges; both rebuilds:
    every tile is tile_bits' (escaped slots +0), and with the escapes put back, the matrix."""
    import triton
    import triton.language as tl

    from specpilot.kernels.w12.tile_kernels import w12_base, w12_tile

    @triton.jit
    def rebuild(rec, exps, out, N, K: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                ASM: tl.constexpr):  # fmt: skip
        n0, k0 = tl.program_id(0) * BN, tl.program_id(1) * BK
        w = w12_tile(rec, w12_base(exps, n0, N, BN), n0, k0, K, BN, BK, ASM)
        rows, cols = n0 + tl.arange(0, BN), k0 + tl.arange(0, BK)
        tl.store(out + rows[:, None] * KP + cols[None, :], w)

    w = _specials(n, k)
    tw = tile_weight(w)
    assert tw is not None and tw.escapes > 0
    np_, kp = triton.cdiv(n, bn) * bn, triton.cdiv(k, bk) * bk
    out = torch.full((np_, kp), 7.0, dtype=torch.bfloat16, device=CUDA)
    rebuild[(np_ // bn, kp // bk)](tw.records, tw.exps, out, n, K=k, KP=kp, BN=bn, BK=bk, ASM=asm)
    assert torch.equal(_bits(out[:n, :k]), _bits(tile_bits(tw)))
    assert torch.equal(_bits(with_escapes(tw, out[:n, :k])), _bits(w))
    assert not bool(out[n:].float().any()) and not bool(out[:, k:].float().any()), "padding is zero"


@pytest.mark.parametrize("live", [16, 5])
@pytest.mark.parametrize(
    ("n", "k", "bn", "bk"), [(384, 512, 32, 128), (300, 320, 16, 64), (256, 640, 128, 128)]
)
def test_a_gemv_with_escapes_is_the_exact_sum(n, k, bn, bk, live):
    """tile_kernels.w12_gemv (the entry's kernels' GEMV: tile dots, escapes after the K loop) on 16
    rows of activations of which `live` are real: within fp32 summation error of the exact sum on
    finite outputs; inf and NaN where torch's fp32 product of the same bf16 operands has them."""
    import triton
    import triton.language as tl

    from specpilot.kernels.w12.tile_kernels import w12_gemv

    @triton.jit
    def gemv(
        a_ptr, rec, exps, ep, er, ec, eb, out, N, R, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
    ):
        n0 = tl.program_id(0) * BN
        rows = tl.arange(0, 16)
        rmask = rows < R
        acc = w12_gemv(a_ptr, rec, exps, ep, er, ec, eb, n0, N, rows, rmask, K, 16, BN, BK)
        cols = n0 + tl.arange(0, BN)
        tl.store(out + rows[:, None] * N + cols[None, :], acc, mask=rmask[:, None] & (cols < N)[None, :])

    w = _specials(n, k)
    tw = tile_weight(w)
    a = torch.randn(16, k, device=CUDA, generator=torch.Generator(device=CUDA).manual_seed(n)).bfloat16()
    out = torch.full((16, n), 7.0, device=CUDA)
    gemv[(triton.cdiv(n, bn),)](a, *tw.parts(), out, n, live, K=k, BN=bn, BK=bk)
    assert bool((out[live:] == 7.0).all()), "rows past the live ones are not written"
    a, out = a[:live], out[:live]
    want = a.float() @ w.float().T  # inf and NaN as an fp32 product of the same operands has them
    fin = torch.isfinite(want)
    assert torch.equal(fin, torch.isfinite(out)) and torch.equal(torch.isnan(want), torch.isnan(out))
    wf = torch.where(torch.isfinite(w), w, 0).double()
    exact = (a.double() @ wf.T)[fin]
    bound = (a.double().abs() @ wf.abs().T)[fin] * k * 2.0**-23
    assert bool(((out.double()[fin] - exact).abs() <= bound + 1e-40).all())
    assert tw.escapes > 0 and bool((out[fin] != 0).any())


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    return import_tree(
        checkout_entry(tmp_path_factory.mktemp("w12") / "tree", "refspec-w12"), "refspec_w12_gpu"
    )


def _models(pkg, tweak=None):
    """(stock CudaModel, CudaModel for the W12 engine) on the same synthetic weights."""
    from refspec_w12_gpu.cuda_graphs import CudaModel
    from refspec_w12_gpu.synthetic import synthetic_state
    from refspec_w12_gpu.weights import SYNTHETIC

    cfg = dict(SYNTHETIC["wide27b-8l"], num_hidden_layers=2, vocab_size=4096, model_type="llama")
    args = pkg.model.ModelArgs.from_hf(cfg)
    out = []
    for _ in range(2):
        state = synthetic_state(cfg, CUDA)
        if tweak:
            tweak(state)
        out.append(CudaModel(args, state, CUDA, 1024))
        del state
    assert not out[0].persistent, "the layers are read-bound: stock runs the per-phase kernels"
    return out


@pytest.fixture(scope="module")
def models(pkg):
    stock, model = _models(pkg)
    w12 = engine_for(pkg, model)
    return engine_for(pkg, stock, w12={"enabled": False}), w12


def test_every_matrix_reads_records(models):
    from refspec_w12_gpu.w12tiles.tiles import TileWeight

    stock, w12 = models
    assert type(w12.model).__name__ == "W12CudaModel" and type(stock.model).__name__ == "CudaModel"
    for layer in w12.model.layers:
        assert all(isinstance(layer[j], TileWeight) for j in (1, 2, 4, 5))
    assert isinstance(w12.model.head_w12, TileWeight)
    w = (
        sum(layer[j].nbytes() for layer in w12.model.layers for j in (1, 2, 4, 5))
        + w12.model.head_w12.nbytes()
    )
    b = (
        sum(layer[j].numel() * 2 for layer in stock.model.layers for j in (1, 2, 4, 5))
        + stock.model.head.numel() * 2
    )
    assert 0.75 < w / b < 0.76, w / b  # 12 bits + the escape lists and their CSR
    # The passes below run escapes in every kind of row: both halves of a pair block (RoPE lo / hi,
    # gate / up), Q, K and V, o, down and the head (the synthetic weights escape ~1 in 10^4).
    pairs = w12.model.pairs
    for layer in w12.model.layers:
        qkv, o, gu, down = (layer[j] for j in (1, 2, 4, 5))
        rows = qkv.esc_row.long()[: qkv.escapes]
        a = w12.model.args
        assert {0, 1} <= set(((rows // pairs["QKV"]) % 2).tolist()), "escapes in lo and hi rows"
        part = rows // (a.heads * a.head_dim)  # 0: Q, 1: K and V
        assert {0, 1} <= set(part.clamp(max=1).tolist()), "escapes in Q rows and in K/V rows"
        gu_rows = gu.esc_row.long()[: gu.escapes]
        assert {0, 1} <= set(((gu_rows // pairs["GATE_UP"]) % 2).tolist()), "escapes in gate and up rows"
        assert o.escapes > 0 and down.escapes > 0
    assert w12.model.head_w12.escapes > 0


def _pass(model, tokens, start, mask=None):
    out = model.verify(tokens, list(range(start, start + len(tokens))), start, mask)
    kv = torch.cat([model.kc[:, :, : start + len(tokens)], model.vc[:, :, : start + len(tokens)]], dim=-1)
    return out, model.x[: len(tokens)].clone(), kv.clone()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _clear_argmax(model, x: torch.Tensor, got: list[int], want: list[int]) -> None:
    """`got` equals `want` on every row whose fp32 logits (from stock's hidden state x) are not
    near-tied: top two apart by more than 1% of the top."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + model.args.rms_eps) * model.norm.float()
    top = (h @ model.head.float().T).topk(2, dim=-1).values
    clear = ((top[:, 0] - top[:, 1]) > 0.01 * top[:, 0].abs()).tolist()
    assert all(g == w for g, w, c in zip(got, want, clear, strict=True) if c), (got, want, clear)
    assert sum(clear) >= len(clear) // 2, "most rows have a clear argmax"


@pytest.mark.parametrize("rows", [1, 7, 16, 33])
def test_a_pass_is_stock_up_to_summation_order(models, rows):
    """Prefill (eager kernels), then a captured pass: hidden states and K/V within bf16 rounding of
    stock's, argmax equal where not near-tied; the two rebuilds give the same bits."""
    stock, w12 = models
    g = torch.Generator().manual_seed(rows)
    prompt = torch.randint(0, 4096, (90,), generator=g).tolist()
    tokens = torch.randint(0, 4096, (rows,), generator=g).tolist()
    got = []
    for eng, asm in ((stock, True), (w12, True), (w12, False)):
        eng.model.w12_asm = asm
        eng.model.graphs.clear()
        eng.model.prefill(prompt, 0)
        got.append(_pass(eng.model, tokens, len(prompt)))
    w12.model.w12_asm = True
    w12.model.graphs.clear()
    (out_s, x_s, kv_s), (out_w, x_w, kv_w), (out_t, x_t, kv_t) = got
    assert out_w == out_t and torch.equal(_bits(x_w), _bits(x_t)) and torch.equal(_bits(kv_w), _bits(kv_t))
    # Row by row (a row whose embedding is large would hide another's error in one norm), and K/V
    # slot by slot.
    assert max(_rel(x_w[r], x_s[r]) for r in range(rows)) < 1e-2
    kv_w, kv_s = kv_w.transpose(0, 2).flatten(1), kv_s.transpose(0, 2).flatten(1)  # [slots, ...]
    assert max(_rel(kv_w[t], kv_s[t]) for t in range(kv_s.shape[0])) < 1e-2
    _clear_argmax(stock.model, x_s, out_w, out_s)


def test_w12_spec_decoding_is_its_ar(pkg, models):
    _, w12 = models
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        prompt = (torch.randint(0, 4096, (12,), generator=g).tolist()) * 3
        ar, _ = pkg.generate.greedy(w12, prompt, 24, "ar")
        spec, stats = pkg.generate.greedy(w12, prompt, 24, "spec")
        assert spec == ar and stats.steps <= 24


def test_specials_and_huge_activations(pkg):
    """Weights with inf, NaN, denormals and outliers; a token whose embedding is near bf16's limit:
    the same non-finite positions as stock's, the finite values within rounding."""

    def tweak(state):
        o = state["model.layers.0.self_attn.o_proj.weight"]
        o[5, :9] = torch.tensor([0.0, -0.0, 1e-39, -3e-39, float("inf"), 1e4, -3e-20, 2.0, float("nan")]).to(
            o
        )
        for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.gate_proj.weight"):
            state[name][7, 100:103] = torch.tensor([3e3, -3e-20, 1e-39]).to(o)  # escapes of normed kernels
        state["model.embed_tokens.weight"][11] *= 2.0**120

    stock, model = _models(pkg, tweak)
    engines = [engine_for(pkg, stock, w12={"enabled": False}), engine_for(pkg, model)]
    got = []
    for eng in engines:
        eng.model.prefill([3, 11, 4, 11, 5], 0)
        got.append(_pass(eng.model, [11, 6, 7], 5))
    for a, b in ((got[0][1], got[1][1]), (got[0][2], got[1][2])):
        fin = torch.isfinite(a)
        assert torch.equal(fin, torch.isfinite(b)) and torch.equal(torch.isnan(a), torch.isnan(b))
        assert not fin.any() or _rel(b[fin], a[fin]) < 1e-2


def test_stands_aside_on_the_persistent_pass(pkg, capfd):
    from refspec_w12_gpu.cuda_graphs import CudaModel
    from refspec_w12_gpu.synthetic import synthetic_state
    from refspec_w12_gpu.weights import SYNTHETIC

    cfg = dict(SYNTHETIC["wide27b-8l"], hidden_size=256, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1024, model_type="llama")  # fmt: skip
    model = CudaModel(pkg.model.ModelArgs.from_hf(cfg), synthetic_state(cfg, CUDA), CUDA, 512)
    assert model.persistent
    eng = engine_for(pkg, model)
    assert type(eng.model) is CudaModel and isinstance(eng.model.layers[0][1], torch.Tensor)
    assert "w12: stands aside on the persistent pass" in capfd.readouterr().err
