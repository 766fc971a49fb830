"""refspec's knobs: `refspec.toml` at the tree root, read once at start.

Memory entries retune the engine by patching that file, so an unknown section or key, or a
value of the wrong kind, is an error naming the file and the fix (a typo must never be ignored).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from .errors import RefspecError

TREE_ROOT = Path(__file__).resolve().parents[1]
CONFIG_FILE = TREE_ROOT / "refspec.toml"


@dataclass
class Decode:
    mode: str = "spec"  # "spec" | "ar"
    block_size: int = 8
    top_k: int = 16


@dataclass
class Drafter:
    kind: str = "ngram"
    max_ngram: int = 4
    min_ngram: int = 1


@dataclass
class Runtime:
    dtype: str = "auto"
    threads: int = 1
    cpu_layout: str = "dual"


@dataclass
class Config:
    decode: Decode = field(default_factory=Decode)
    drafter: Drafter = field(default_factory=Drafter)
    runtime: Runtime = field(default_factory=Runtime)

    def knobs(self) -> dict:
        """Every knob as {section: {key: value}} (the serve protocol's ready line reports it)."""
        return {f.name: dict(vars(getattr(self, f.name))) for f in fields(self)}


_CHOICES = {
    ("decode", "mode"): ("spec", "ar"),
    ("drafter", "kind"): ("ngram",),
    ("runtime", "dtype"): ("auto", "float32", "bfloat16", "float16"),
    ("runtime", "cpu_layout"): ("dual", "onednn", "gemv", "plain"),
}
_MINIMUM = {
    ("decode", "block_size"): 1,
    ("decode", "top_k"): 1,
    ("drafter", "max_ngram"): 1,
    ("drafter", "min_ngram"): 1,
    ("runtime", "threads"): 1,
}


def load_config(path: Path = CONFIG_FILE) -> Config:
    """The knobs of refspec.toml (defaults for keys it leaves out)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RefspecError(
            f"{path}: unreadable ({e}); fix the file or restore it from the stock tree"
        ) from None
    config = Config()
    for section, values in data.items():
        if section not in config.knobs() or not isinstance(values, dict):
            raise RefspecError(f"{path}: unknown section [{section}]; known: {', '.join(config.knobs())}")
        target = getattr(config, section)
        for key, value in values.items():
            if not hasattr(target, key):
                known = ", ".join(vars(target))
                raise RefspecError(f"{path}: unknown knob {section}.{key}; known in [{section}]: {known}")
            want = type(getattr(target, key))
            if type(value) is not want:
                raise RefspecError(f"{path}: {section}.{key} = {value!r} must be a {want.__name__}")
            choices = _CHOICES.get((section, key))
            if choices and value not in choices:
                raise RefspecError(f"{path}: {section}.{key} = {value!r}; use one of {', '.join(choices)}")
            if (section, key) in _MINIMUM and value < _MINIMUM[(section, key)]:
                raise RefspecError(f"{path}: {section}.{key} = {value} must be >= {_MINIMUM[(section, key)]}")
            setattr(target, key, value)
    if config.drafter.min_ngram > config.drafter.max_ngram:
        raise RefspecError(f"{path}: drafter.min_ngram must be <= drafter.max_ngram")
    return config
