"""refspec's knobs, read once at start: `refspec.toml` and one `knobs/<mechanism>.toml` per mechanism.

Memory entries retune the engine by patching these files, so an unknown section or key, or a
value of the wrong kind, is an error naming the file and the fix (a typo must never be ignored).
`refspec.toml` holds stock's knobs; a mechanism (refspec/ext/<name>.py) owns the section [<name>]
of its own file `knobs/<name>.toml`, so two mechanisms never edit the same line. Mechanism knobs
are read here as plain TOML and checked against the mechanism's own knob class by `ext.load`.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from .errors import RefspecError

TREE_ROOT = Path(__file__).resolve().parents[1]
CONFIG_FILE = TREE_ROOT / "refspec.toml"
KNOBS_DIR = TREE_ROOT / "knobs"
EXT_DIR = Path(__file__).resolve().parent / "ext"


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
    max_context: int = 4096  # KV slots of the CUDA path's static cache (prompt + new tokens)


@dataclass
class Config:
    decode: Decode = field(default_factory=Decode)
    drafter: Drafter = field(default_factory=Drafter)
    runtime: Runtime = field(default_factory=Runtime)
    ext: dict[str, object] = field(default_factory=dict)  # mechanism -> its knobs (raw dict until ext.load)

    def knobs(self) -> dict:
        """Every knob as {section: {key: value}} (the serve protocol's ready line reports it)."""
        core = {f.name: dict(vars(getattr(self, f.name))) for f in fields(self) if f.name != "ext"}
        return core | {n: dict(k if isinstance(k, dict) else vars(k)) for n, k in sorted(self.ext.items())}


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
    ("runtime", "max_context"): 256,
}


def read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RefspecError(
            f"{path}: unreadable ({e}); fix the file or restore it from the stock tree"
        ) from None


def set_knobs(path: Path, section: str, target: object, values: dict, choices: dict, minimum: dict) -> None:
    """Check `values` against the knob class instance `target` (types, choices, minima) and set them."""
    for key, value in values.items():
        if not hasattr(target, key):
            known = ", ".join(vars(target))
            raise RefspecError(f"{path}: unknown knob {section}.{key}; known in [{section}]: {known}")
        want = type(getattr(target, key))
        if type(value) is not want and not (want is float and type(value) is int):
            raise RefspecError(f"{path}: {section}.{key} = {value!r} must be a {want.__name__}")
        allowed = choices.get(key)
        if allowed and value not in allowed:
            raise RefspecError(
                f"{path}: {section}.{key} = {value!r}; use one of {', '.join(map(str, allowed))}"
            )
        if key in minimum and value < minimum[key]:
            raise RefspecError(f"{path}: {section}.{key} = {value} must be >= {minimum[key]}")
        setattr(target, key, want(value))


def load_config(path: Path = CONFIG_FILE, knobs_dir: Path = KNOBS_DIR) -> Config:
    """The knobs of refspec.toml (defaults for keys it leaves out) and the mechanisms' knob files."""
    config = Config()
    for section, values in read_toml(path).items():
        if section not in ("decode", "drafter", "runtime") or not isinstance(values, dict):
            raise RefspecError(
                f"{path}: unknown section [{section}]; known: decode, drafter, runtime "
                f"(a mechanism's knobs go in knobs/<mechanism>.toml)"
            )
        set_knobs(path, section, getattr(config, section), values,
                  {k: v for (s, k), v in _CHOICES.items() if s == section},
                  {k: v for (s, k), v in _MINIMUM.items() if s == section})  # fmt: skip
    if config.drafter.min_ngram > config.drafter.max_ngram:
        raise RefspecError(f"{path}: drafter.min_ngram must be <= drafter.max_ngram")
    for file in sorted(knobs_dir.glob("*.toml")) if knobs_dir.is_dir() else []:
        name = file.stem
        if not (EXT_DIR / f"{name}.py").is_file():
            raise RefspecError(
                f"{file}: no mechanism refspec/ext/{name}.py owns these knobs; remove the file"
            )
        data = read_toml(file)
        if set(data) != {name} or not isinstance(data[name], dict):
            raise RefspecError(f"{file}: must hold exactly one section, [{name}]")
        config.ext[name] = data[name]
    return config
