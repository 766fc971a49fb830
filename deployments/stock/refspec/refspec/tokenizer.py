"""Tokenizer: byte-level BPE built from the GGUF metadata, saved as an HF tokenizer.json.

Chat templates are not rendered here: refspec serves token ids, and the workload builder
renders the template stored in tokenizer_config.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from .errors import RefspecError

_CONTROL = 3  # gguf token type of special (control) tokens


def tokenizer_files_from_gguf(reader) -> tuple[str, dict]:
    """(tokenizer.json text, tokenizer_config dict) for a GGUF with a gpt2-style BPE vocabulary."""
    fields = reader.fields
    model = fields["tokenizer.ggml.model"].contents()
    pre = fields["tokenizer.ggml.pre"].contents()
    if model != "gpt2":
        raise RefspecError(f"GGUF tokenizer model {model!r} is not supported (only byte-level BPE 'gpt2')")
    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"].contents()]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    # llama.cpp's 'smollm' pre-tokenizer splits every digit apart before the GPT-2 regex.
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if pre == "smollm"
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty == _CONTROL
        ]
    )

    def token(key: str) -> str | None:
        f = fields.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[f.contents()] if f is not None else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "unk_token": token("unknown"),
        "pad_token": token("padding"),
        "bos_token_id": fields["tokenizer.ggml.bos_token_id"].contents(),
        "eos_token_id": fields["tokenizer.ggml.eos_token_id"].contents(),
        "add_bos_token": bool(fields["tokenizer.ggml.add_bos_token"].contents())
        if "tokenizer.ggml.add_bos_token" in fields
        else False,
        "chat_template": fields["tokenizer.chat_template"].contents()
        if "tokenizer.chat_template" in fields
        else None,
        "model_max_length": 8192,
    }
    return tok.to_str(), config


def load_tokenizer(folder: Path) -> tuple[Tokenizer, dict]:
    """(tokenizer, tokenizer_config) of an HF folder."""
    try:
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError, Exception) as e:  # tokenizers raises plain Exception on bad JSON
        raise RefspecError(
            f"{folder}: tokenizer files unreadable ({e}); delete {folder} to rebuild it"
        ) from None
    return tok, config
