"""The target's chat template and tokenizer, rendered and applied the way HF Transformers does.

`apply_chat_template(messages, add_generation_prompt=True)` in Transformers renders the template
with jinja2's ImmutableSandboxedEnvironment (trim_blocks, lstrip_blocks, loopcontrols, a `tojson`
that does not escape HTML, `raise_exception`, `strftime_now`), passes the tokenizer's special tokens
and any extra keyword (here `enable_thinking`) as template variables, then encodes the text with
`add_special_tokens=False`. This module does the same with `tokenizers` alone, so the ids match
Transformers' without importing it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from ..errors import SpecPilotError
from ..home import Home
from ..spec import Deployment

SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}` (Transformers' assistant-mask tag): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _token_text(value) -> str | None:
    # tokenizer_config.json stores a special token as a string or as an AddedToken dict.
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


@dataclass
class ChatTemplate:
    """An HF folder's tokenizer and chat template."""

    folder: Path
    tokenizer: Tokenizer
    source: str  # the jinja text
    special: dict[str, object]  # template variables: bos_token, eos_token, ...
    fingerprint: str  # sha256 over everything that decides the ids

    @property
    def uses_thinking(self) -> bool:
        return "enable_thinking" in self.source

    def render(self, turn: str, system_prompt: str | None = None, thinking: bool = False) -> str:
        """The text of one user turn (after an optional system prompt) with the generation prompt."""
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": turn})
        try:
            template = _environment().from_string(self.source)
            return template.render(
                **self.special, messages=messages, add_generation_prompt=True, enable_thinking=thinking
            )
        except jinja2.TemplateError as e:
            raise SpecPilotError(f"{self.folder}: the chat template failed: {e}") from None

    def encode(self, turn: str, system_prompt: str | None = None, thinking: bool = False) -> list[int]:
        """Token ids of `render(...)`, without the tokenizer adding BOS/EOS (the template writes them)."""
        text = self.render(turn, system_prompt, thinking)
        return self.tokenizer.encode(text, add_special_tokens=False).ids


def load_chat_template(folder: Path) -> ChatTemplate:
    """Read tokenizer.json and the chat template (chat_template.jinja or tokenizer_config.json)."""
    try:
        tok_bytes = (folder / "tokenizer.json").read_bytes()
        tokenizer = Tokenizer.from_str(tok_bytes.decode())
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except Exception as e:  # tokenizers raises plain Exception on a bad file
        raise SpecPilotError(
            f"{folder}: tokenizer.json / tokenizer_config.json unreadable ({e}); the target folder needs both"
        ) from None
    source = config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():  # newer Transformers saves it on its own
        source = (folder / "chat_template.jinja").read_text()
    elif isinstance(source, list):  # named templates: use the default one
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if not isinstance(source, str) or not source:
        raise SpecPilotError(
            f"{folder}: no chat template (tokenizer_config.json has no `chat_template` and there is no "
            "chat_template.jinja); use an instruction-tuned target"
        )
    special: dict[str, object] = {k: t for k in SPECIAL if (t := _token_text(config.get(k))) is not None}
    extra = [t for v in config.get("additional_special_tokens") or [] if (t := _token_text(v))]
    if extra:
        special["additional_special_tokens"] = extra
    digest = hashlib.sha256(tok_bytes)
    digest.update(json.dumps([source, special], sort_keys=True).encode())
    return ChatTemplate(folder, tokenizer, source, special, digest.hexdigest())


def target_folder(dep: Deployment, home: Home) -> Path:
    """The HF folder holding the target's tokenizer and chat template (never the hub at run time)."""
    if dep.engine == "refspec":
        import importlib

        from ..stock import import_refspec

        import_refspec()  # the pristine stock tree's `refspec` on sys.path
        weights = importlib.import_module("refspec.weights")
        return weights.resolve_model(dep.target.model, home.cache)
    folder = Path(dep.target.model).expanduser()
    if not (folder / "tokenizer.json").is_file():
        raise SpecPilotError(
            f"deployment {dep.name!r}: target.model {dep.target.model!r} is not a local HF folder with "
            "tokenizer.json, and request files are built offline; download the model (e.g. "
            f"`huggingface-cli download {dep.target.model} --local-dir DIR`) and set target.model to DIR"
        )
    return folder
