"""The prepare run's decoy model folder: the real shapes and config, never a byte of real weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specpilot.controller.refspec_system import DECOY_KEEPS, decoy_folder
from specpilot.deployments import Home, SpecPilotError


def test_a_decoy_keeps_shapes_config_and_tokenizer_and_no_other_file(tmp_path: Path):
    real = tmp_path / "models" / "tiny"
    real.mkdir(parents=True)
    weights = {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": torch.ones(5, dtype=torch.bfloat16),
    }
    save_file(weights, str(real / "model.safetensors"))
    (real / "config.json").write_text('{"hidden_size": 4}')
    (real / "tokenizer.json").write_text("{}")
    for other in ("pytorch_model.bin", "model.gguf", "weights.npy", "notes.txt", "consolidated.pth"):
        (real / other).write_bytes(b"the real weights, in another format")
    decoy = decoy_folder(real, Home(tmp_path / "home"))
    names = {p.name for p in decoy.iterdir()}
    assert names == {"model.safetensors", "config.json", "tokenizer.json", "DECOY"}
    assert names - {"model.safetensors", "DECOY"} <= DECOY_KEEPS
    got = load_file(str(decoy / "model.safetensors"))
    assert {k: (v.shape, v.dtype) for k, v in got.items()} == {
        k: (v.shape, v.dtype) for k, v in weights.items()
    }
    assert not torch.equal(got["w"], weights["w"]) and not torch.equal(got["b"], weights["b"])


def test_a_folder_without_safetensors_gets_no_decoy(tmp_path: Path):
    real = tmp_path / "models" / "gguf-only"
    real.mkdir(parents=True)
    (real / "model.gguf").write_bytes(b"weights")
    with pytest.raises(SpecPilotError, match="no .safetensors weights"):
        decoy_folder(real, Home(tmp_path / "home"))


def test_a_synthetic_folder_gets_another_seed_and_its_tokenizer(tmp_path: Path):
    """Weights drawn at load (refspec/synthetic.py): the decoy is the same shapes under another seed."""
    real = tmp_path / "models" / "wide"
    real.mkdir(parents=True)
    config = {"hidden_size": 64, "vocab_size": 300, "synthetic": {"seed": 4, "gain": 1.0, "row_spread": 2.0}}
    (real / "config.json").write_text(json.dumps(config))
    (real / "tokenizer.json").write_text("{}")
    (real / "notes.txt").write_text("not kept")
    decoy = decoy_folder(real, Home(tmp_path / "home"))
    assert {p.name for p in decoy.iterdir()} == {"config.json", "tokenizer.json", "DECOY"}
    got = json.loads((decoy / "config.json").read_text())
    assert got == config | {"synthetic": config["synthetic"] | {"seed": 5}}
