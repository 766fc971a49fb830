"""Memory entries (CONTRACTS §8): what one verified mechanism is, and how its fields are checked.

An entry is a code delta relative to stock + the entries it requires, with the tree hash its
application must produce, a variant registry (knobs an agent may retune), correctness contracts,
options, evidence, limits and unverified areas. Dataclasses inside; the pydantic models here read
entry metadata at the edges (a `--meta` file, a bundle's `bundle.json`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from specpilot.deployments import SpecPilotError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
MAX_NAME = 64
MAX_REQUIRES = 12
TARGET_FACTORS = ("tree", "kernel", "outside", "none")
TargetFactor = Literal["tree", "kernel", "outside", "none"]
TREE_RE = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")  # SHA-1 or SHA-256 object names


@dataclass(frozen=True)
class Variant:
    """A knob an entry exposes for retuning: `knob` in `file` (tree-relative), tested `values`,
    and `default`, the value the entry's own tree holds."""

    knob: str
    file: str
    values: list[Any]
    default: Any

    def as_dict(self) -> dict[str, Any]:
        return {"knob": self.knob, "file": self.file, "values": list(self.values), "default": self.default}


@dataclass
class Entry:
    name: str
    engine: str
    stock_tree: str
    requires: list[str]
    delta: str
    tree: str
    summary: str = ""
    target_factor: str = "none"
    variants: list[Variant] = field(default_factory=list)
    contracts: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    evidence: list[dict[str, Any]] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    created_at: datetime | None = None

    def meta(self) -> dict[str, Any]:
        """The descriptive fields (everything but identity and code), as plain JSON data."""
        return {
            "summary": self.summary,
            "target_factor": self.target_factor,
            "variants": [v.as_dict() for v in self.variants],
            "contracts": list(self.contracts),
            "options": dict(self.options),
            "evidence": [dict(e) for e in self.evidence],
            "limits": list(self.limits),
            "unverified": list(self.unverified),
        }

    def as_dict(self, delta: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "engine": self.engine,
            "stock_tree": self.stock_tree,
            "requires": list(self.requires),
            "tree": self.tree,
            **self.meta(),
            "created_at": self.created_at.isoformat() if self.created_at else None,
        }
        if delta:
            out["delta"] = self.delta
        return out

    def delta_stats(self) -> dict[str, int]:
        """Files the delta changes and the lines it adds and removes (hunk lines only)."""
        files = added = removed = 0
        in_hunk = False
        for line in self.delta.splitlines():
            if line.startswith("diff --git "):
                files, in_hunk = files + 1, False
            elif line.startswith("@@"):
                in_hunk = True
            elif in_hunk and line.startswith("+"):
                added += 1
            elif in_hunk and line.startswith("-"):
                removed += 1
        return {"files": files, "added": added, "removed": removed}

    def same_code(self, other: Entry) -> bool:
        """True when both entries are the same mechanism: same base, requirements and delta."""
        return (self.engine, self.stock_tree, self.requires, self.delta, self.tree) == (
            other.engine,
            other.stock_tree,
            other.requires,
            other.delta,
            other.tree,
        )


def check_name(name: str, what: str = "entry name") -> str:
    if not NAME_RE.match(name) or len(name) > MAX_NAME:
        raise SpecPilotError(
            f"{what} {name!r} is not valid: use lowercase letters, digits and '-', starting with a "
            f"letter or digit, at most {MAX_NAME} characters"
        )
    return name


def check_requires(name: str, requires: list[str]) -> list[str]:
    """Validate an entry's direct requirements: names, no repeats, no self, at most 12."""
    for r in requires:
        check_name(r, f"requirement of {name!r}:")
    if name in requires:
        raise SpecPilotError(f"entry {name!r} requires itself: requirement cycle {name} -> {name}")
    dup = sorted({r for r in requires if requires.count(r) > 1})
    if dup:
        raise SpecPilotError(f"entry {name!r} lists requirement(s) {dup} more than once")
    if len(requires) > MAX_REQUIRES:
        raise SpecPilotError(
            f"entry {name!r} has {len(requires)} requirements; an entry may require at most "
            f"{MAX_REQUIRES} (split it, or require an entry that already bundles several)"
        )
    return requires


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VariantModel(StrictModel):
    knob: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
    file: str = Field(min_length=1)
    values: list[Any] = Field(min_length=1)
    default: Any

    @field_validator("file")
    @classmethod
    def _relative(cls, f: str) -> str:
        p = PurePosixPath(f)
        if p.is_absolute() or ".." in p.parts or "\\" in f:
            raise ValueError(f"{f!r} must be a path relative to the tree root, without '..'")
        return p.as_posix()

    def to_variant(self) -> Variant:
        return Variant(self.knob, self.file, list(self.values), self.default)


class EntryMeta(StrictModel):
    """The descriptive fields of an entry, as a `--meta` JSON/TOML file or in a bundle."""

    summary: str = ""
    target_factor: TargetFactor = "none"
    variants: list[VariantModel] = Field(default_factory=list)
    contracts: list[str] = Field(default_factory=list)
    options: dict[str, Any] = Field(default_factory=dict)
    evidence: list[dict[str, Any]] = Field(default_factory=list)
    limits: list[str] = Field(default_factory=list)
    unverified: list[str] = Field(default_factory=list)

    @field_validator("variants")
    @classmethod
    def _distinct(cls, variants: list[VariantModel]) -> list[VariantModel]:
        keys = [(v.file, v.knob) for v in variants]
        dup = sorted({f"{f}:{k}" for f, k in keys if keys.count((f, k)) > 1})
        if dup:
            raise ValueError(f"knob(s) listed twice: {dup}")
        return variants

    def fields(self) -> dict[str, Any]:
        """Keyword arguments for `Entry`."""
        return {
            "summary": self.summary,
            "target_factor": self.target_factor,
            "variants": [v.to_variant() for v in self.variants],
            "contracts": list(self.contracts),
            "options": dict(self.options),
            "evidence": [dict(e) for e in self.evidence],
            "limits": list(self.limits),
            "unverified": list(self.unverified),
        }


def describe(err: ValidationError) -> str:
    """One line naming every invalid field."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "missing required field"
        parts.append(f"field `{loc}`: {msg}")
    return "; ".join(parts)
