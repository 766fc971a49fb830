"""Synthetic targets (refspec/synthetic.py): weights drawn from a seed where the model loads.

The contract: the same (seed, name, shape) gives the same bf16 bits on every call and device (a
GPU check is in tests/gpu/test_refspec_cuda.py); tensors are independent of each other's order and
of the layer count; the values have the documented distribution (row scales spread over
`row_spread` binades, norm gains in 0.75-1.25); a synthetic folder serves through open_engine like
any HF folder, spec equal to AR; a folder with a bad `synthetic` section is one clear error.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from specpilot.deployments.stock import import_refspec, stock_tree_path

import_refspec()
from refspec.config import Config  # noqa: E402
from refspec.errors import RefspecError  # noqa: E402
from refspec.generate import greedy  # noqa: E402
from refspec.model import load_weights  # noqa: E402
from refspec.runtime import open_engine  # noqa: E402
from refspec.synthetic import draw_gain, draw_matrix, synthetic_state  # noqa: E402
from refspec.weights import SYNTHETIC, resolve_model  # noqa: E402

CPU = torch.device("cpu")
TREE = stock_tree_path("refspec")
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 300, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512, "synthetic": {"seed": 3, "gain": 1.0, "row_spread": 2.0}}  # fmt: skip


def test_the_same_bits_every_draw_and_chunking_does_not_change_them(monkeypatch):
    a = draw_matrix(96, 64, 7, "w", 1.0, 2.0, CPU)
    assert a.dtype == torch.bfloat16
    assert torch.equal(a.view(torch.int16), draw_matrix(96, 64, 7, "w", 1.0, 2.0, CPU).view(torch.int16))
    import refspec.synthetic as syn

    monkeypatch.setattr(syn, "_CHUNK", 100)  # a row per chunk
    assert torch.equal(a.view(torch.int16), draw_matrix(96, 64, 7, "w", 1.0, 2.0, CPU).view(torch.int16))
    assert not torch.equal(a, draw_matrix(96, 64, 8, "w", 1.0, 2.0, CPU))  # another seed
    assert not torch.equal(a, draw_matrix(96, 64, 7, "v", 1.0, 2.0, CPU))  # another name


def test_the_distribution_row_scales_and_gains():
    w = draw_matrix(512, 1024, 0, "m", 1.0, 2.0, CPU).float()
    base = 1.0 / math.sqrt(1024)
    sd = w.std(dim=1) / base  # per row: 2^e for e in [-1, 1], 64 levels
    assert 0.45 < sd.min() < 0.6 and 1.8 < sd.max() < 2.2
    assert len(torch.unique(torch.log2(sd).mul(63 / 2).round())) > 40  # the levels are used
    z = w / w.std(dim=1, keepdim=True)
    assert abs(z.mean()) < 0.01 and z.abs().max() < 3.5  # Irwin-Hall(4): |z| <= 3.46
    g = draw_gain(4096, 0, "g", CPU).float()
    assert g.min() >= 0.75 and g.max() <= 1.25 and len(torch.unique(g)) == 16


def test_a_tensor_does_not_depend_on_the_layer_count():
    one = synthetic_state(TINY | {"num_hidden_layers": 1}, CPU)
    two = synthetic_state(TINY, CPU)
    assert set(two) > set(one) and "lm_head.weight" not in two
    for name, t in one.items():
        assert torch.equal(t.view(torch.int16), two[name].view(torch.int16)), name


def test_a_synthetic_folder_serves_spec_equal_to_ar(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    args, state = load_weights(tmp_path)
    assert (args.hidden, args.layers, args.vocab) == (64, 2, 300)
    engine = open_engine("cpu:0", str(tmp_path), None, Config())
    prompt = [5, 9, 5, 9, 5, 9, 17, 5, 9]
    ar, _ = greedy(engine, prompt, 24, mode="ar")
    spec, _ = greedy(engine, prompt, 24, mode="spec")
    assert spec == ar and len(ar) == 24 and max(ar) < 300


def test_a_bad_synthetic_section_is_one_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY | {"synthetic": {"seed": "zero"}}))
    with pytest.raises(RefspecError, match="needs an integer 'seed'"):
        load_weights(tmp_path)
    for bad in ({"gain": "1"}, {"gain": 0}, {"row_spread": -1.0}, {"gain": float("nan")}):
        (tmp_path / "config.json").write_text(json.dumps(TINY | {"synthetic": {"seed": 0} | bad}))
        with pytest.raises(RefspecError, match="gain .* must be a number > 0 and row_spread"):
            load_weights(tmp_path)


def test_the_built_in_wide_target_has_the_papers_27b_layer_shapes():
    folder = resolve_model("wide27b-8l")  # the shared cache, beside SmolLM2 (its tokenizer)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg == json.loads(json.dumps(cfg)) and cfg["synthetic"]["seed"] == 0
    h, d = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    assert (q + 2 * kv, h) == (10240, 5120) and (h, q) == (5120, 8192)
    assert 2 * cfg["intermediate_size"] == 34816 and cfg["vocab_size"] == 248320
    assert (folder / "tokenizer.json").is_file() and not list(folder.glob("*.safetensors"))
    assert set(SYNTHETIC) == {"wide27b-8l"}


def test_a_decoys_folder_under_the_built_in_name_is_served_as_it_is(tmp_path):
    """The prepare run binds a decoy (another seed) at models/<name>: it is used, not rewritten."""
    first = resolve_model("wide27b-8l")
    folder = tmp_path / "models" / "wide27b-8l"
    folder.mkdir(parents=True)
    cfg = json.loads((first / "config.json").read_text())
    cfg["synthetic"]["seed"] = 1
    (folder / "config.json").write_text(json.dumps(cfg))
    os.chmod(folder, 0o555)  # read-only, as the confined system sees it
    try:
        assert resolve_model("wide27b-8l", tmp_path) == folder
        assert json.loads((folder / "config.json").read_text())["synthetic"]["seed"] == 1
    finally:
        os.chmod(folder, 0o755)


def test_processes_making_the_folder_at_once_all_get_it(tmp_path):
    """Test workers share one cache: four processes resolving the name at once each get a whole
    folder, and a stale one (other shapes) is replaced."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "smollm2-135m-instruct").symlink_to(resolve_model("smollm2-135m-instruct"))
    stale = tmp_path / "models" / "wide27b-8l"
    stale.mkdir()
    (stale / "config.json").write_text(json.dumps({"hidden_size": 1, "synthetic": {"seed": 0}}))
    code = (
        "import sys; from pathlib import Path; from refspec.weights import resolve_model; "
        "f = resolve_model('wide27b-8l', Path(sys.argv[1])); "
        "assert (f / 'tokenizer.json').stat().st_size > 0 and (f / 'config.json').read_text()"
    )
    env = {**os.environ, "PYTHONPATH": str(TREE)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert json.loads((stale / "config.json").read_text())["hidden_size"] == 5120
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["smollm2-135m-instruct", "wide27b-8l"]
