"""The Triton kernels of the certified head, run on the CPU through Triton's interpreter.

The interpreter must be switched on before Triton is first imported, so the real tests run in a
child pytest with TRITON_INTERPRET=1; in this process only the launcher test below runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.skipif(INTERPRETED, reason="this is the launcher")
def test_kernels_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # Only this launcher may be skipped in the child; every interpreted test must have run.
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 6 and "1 skipped" in summary, summary


if INTERPRETED:
    from specpilot.kernels.certified_head import CertifiedHead, exact_argmax, exact_logits
    from specpilot.kernels.certified_head.gpu import OVERFLOW, UNSURE

    from .certhead_cases import (
        embed_pair,
        fp64_tie,
        hostile_head,
        hostile_hidden,
        int8_ranks_wrong,
        near_tie_int8_wrong,
        realistic_head,
        realistic_hidden,
        smollm2_head_and_hidden,
    )

    def _gen(seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed)

    @pytest.mark.parametrize(
        ("V", "H", "M", "dtype"),
        [(2048, 512, 1, torch.bfloat16), (1500, 200, 5, torch.float32), (600, 576, 66, torch.bfloat16)],
    )
    def test_bounds_sound_and_argmax_identical(V, H, M, dtype):
        gen = _gen(V + H + M)
        W = realistic_head(V, H, gen, dtype)
        head = CertifiedHead(W, backend="triton", cap=64)
        for h in (realistic_hidden(W, M, gen), hostile_hidden(M, H, gen).to(dtype)):
            lower, upper = head.bounds(h)
            z, err = exact_logits(W, h)
            assert bool((lower.double() <= z - err).all()) and bool((upper.double() >= z + err).all())
            res = head.argmax(h)
            assert torch.equal(res.argmax, exact_argmax(W, h))
        # Hostile rows (huge, tiny, spiky, constant, zero) keep the bounds sound too.
        Wh = hostile_head(V, H, gen)
        hh = hostile_hidden(M, H, gen)
        lower, upper = CertifiedHead(Wh, backend="triton").bounds(hh)
        z, err = exact_logits(Wh, hh)
        assert bool((lower.double() <= z - err).all()) and bool((upper.double() >= z + err).all())

    def test_near_ties_and_fallbacks():
        gen = _gen(11)
        rows, h, _, _ = near_tie_int8_wrong(256, gen)
        W = embed_pair(rows, h, 3000, at=(10, 2000), gen=gen)
        assert int8_ranks_wrong(W, h, 2000, 10)
        head = CertifiedHead(W, backend="triton")
        assert int(head.argmax(h[None]).argmax[0]) == 2000
        # A float64 tie: the final kernel flags it and the host orders the pair exactly.
        rows, h = fp64_tie(64)
        W = embed_pair(rows, h, 700, at=(3, 400), gen=gen)
        head = CertifiedHead(W, backend="triton")
        b = head._triton.buffers(1)
        head._triton.launch(h[None].contiguous(), b)
        assert int(b.out[1, 0]) == UNSURE  # row 1 of out: the flags
        assert int(head.argmax(h[None]).argmax[0]) == 400 == int(exact_argmax(W, h[None])[0])
        # More survivors than slots: flagged, then rescored from the full upper bounds.
        # Rows that differ by less than their quantization error: hundreds of survivors.
        W = torch.randn(128, generator=gen) + 1e-3 * torch.randn(3000, 128, generator=gen)
        h = torch.randn(2, 128, generator=gen)
        head = CertifiedHead(W, backend="triton", cap=16)
        b = head._triton.buffers(2)
        head._triton.launch(h, b)
        assert OVERFLOW in b.out[1].tolist()
        res = head.argmax(h)
        assert torch.equal(res.argmax, exact_argmax(W, h))
        assert bool((res.n_survivors > 16).any())

    def test_nonfinite_hidden_is_an_error():
        head = CertifiedHead(torch.randn(300, 64), backend="triton")
        h = torch.randn(2, 64)
        h[1, 0] = float("inf")
        with pytest.raises(ValueError, match="inf or NaN"):
            head.argmax(h)

    def test_finite_hidden_whose_norm_overflows_float32_is_exact():
        gen = _gen(9)
        W = torch.randn(400, 64, generator=gen)
        h = torch.randn(3, 64, generator=gen).clamp(-3, 3) * 1e38  # finite; ||h|| beyond float32
        h[1] = torch.randn(64, generator=gen)  # an ordinary row beside them
        head = CertifiedHead(W, backend="triton")
        assert torch.equal(head.argmax(h).argmax, exact_argmax(W, h))

    def test_real_smollm2_hidden_states():
        W, hidden = smollm2_head_and_hidden()
        W = W[:16384].contiguous()  # a third of the real rows keeps the interpreter near 10 s
        h = hidden[::40][:4].contiguous()
        res = CertifiedHead(W, backend="triton").argmax(h)
        assert torch.equal(res.argmax, exact_argmax(W, h))
        assert int(res.n_survivors.max()) < 200
