"""The W12 drop-in: convert every nn.Linear of a model, outputs unchanged bit for bit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from specpilot.kernels.w12 import W12FormatError, W12Linear, convert_model, set_qpass

from .w12_data import trained_like


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(128, 256, bias=True)  # tile-sized: every row coded
        self.down = nn.Linear(256, 128, bias=False)
        self.lm_head = nn.Linear(128, 50, bias=False)

    def forward(self, x):
        return self.lm_head(self.down(torch.relu(self.up(x))))


def _tiny() -> TinyMLP:
    torch.manual_seed(0)
    m = TinyMLP()
    with torch.no_grad():
        m.up.weight.copy_(trained_like(256, 128, seed=1).float())
        m.down.weight.copy_(trained_like(128, 256, seed=2).float())
    return m.to(torch.bfloat16)


def test_converted_model_gives_the_same_bits_on_cpu():
    model = _tiny()
    x = torch.randn(7, 128).bfloat16()
    want = model(x)
    stats = convert_model(model)
    assert set(stats) == {"up", "down"}  # lm_head skipped by default
    assert isinstance(model.up, W12Linear) and isinstance(model.lm_head, nn.Linear)
    assert torch.equal(model(x).view(torch.int16), want.view(torch.int16))
    # fp32 activations through bf16-exact weights, as refspec runs on CPU
    ref32 = torch.nn.functional.linear(x.float(), _tiny().up.weight.float(), _tiny().up.bias.float())
    assert torch.equal(model.up(x.float()), ref32)


def test_qpass_switch_changes_outputs_and_back():
    model = _tiny()
    convert_model(model)
    x = torch.randn(3, 128).bfloat16()
    exact = model(x).detach()
    set_qpass(model, True)
    q = model(x).detach()
    assert not torch.equal(q, exact)
    assert float((q.float() - exact.float()).norm() / exact.float().norm()) < 0.05
    set_qpass(model, False)
    assert torch.equal(model(x), exact)


def test_fp32_weights_are_refused_unless_cast_is_asked_for():
    model = _tiny().float()
    with pytest.raises(W12FormatError, match="lossless only for bf16"):
        convert_model(model)
    stats = convert_model(model, cast=True)
    assert stats["up"]["cast_from"] == "torch.float32"


@pytest.mark.slow
def test_hf_smollm2_converted_to_w12_keeps_its_logits_bit_for_bit():
    transformers = pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "deployments" / "stock" / "refspec"))
    from refspec.weights import resolve_model

    folder = resolve_model("smollm2-135m-instruct", Path(os.environ["SPECPILOT_CACHE"]))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=torch.bfloat16)
    model.eval()
    ids = torch.tensor([[1, 504, 3458, 282, 260, 1345, 30, 198]])
    with torch.no_grad():
        want = model(ids).logits
        stats = convert_model(model)
        got = model(ids).logits
    assert len(stats) == 30 * 7  # q, k, v, o, gate, up, down in every layer; lm_head (tied) kept
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
