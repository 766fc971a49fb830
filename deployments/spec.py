"""Deployment specs: one TOML file per deployment, loaded into pydantic models (ARCHITECTURE §11).

A deployment fixes everything a measurement depends on: engine and stock tree, target, drafter,
device kind and slots, serving shape, workload and precision. Unknown fields are errors, so a
typo never silently falls back to a default.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import SpecPilotError

SLOT_RE = re.compile(r"^(cpu|cuda):(\d+)$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Arch(_Strict):
    """Target shapes the cost model computes bytes and FLOPs from."""

    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    intermediate: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab: int = Field(gt=0)
    tied_embeddings: bool = False
    # Hybrid targets: this many of `layers` are Gated DeltaNet (recurrent state) layers.
    gdn_layers: int = Field(default=0, ge=0)
    gdn_key_heads: int = Field(default=0, ge=0)
    gdn_value_heads: int = Field(default=0, ge=0)
    gdn_head_dim: int = Field(default=0, ge=0)
    sliding_window: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _gdn_consistent(self) -> Arch:
        if self.gdn_layers > self.layers:
            raise ValueError(f"gdn_layers ({self.gdn_layers}) exceeds layers ({self.layers})")
        if self.gdn_layers and not (self.gdn_key_heads and self.gdn_value_heads and self.gdn_head_dim):
            raise ValueError("gdn_layers > 0 needs gdn_key_heads, gdn_value_heads and gdn_head_dim")
        return self


class Stock(_Strict):
    """The pristine tree every system of this deployment descends from."""

    tree: str | None = None  # a built-in stock tree under deployments/stock/ (refspec)
    wheel: str | None = None  # a pinned wheel unpacked as the stock tree (sglang==0.5.20)

    @model_validator(mode="after")
    def _one_source(self) -> Stock:
        if (self.tree is None) == (self.wheel is None):
            raise ValueError("set exactly one of `tree` (built-in stock tree) or `wheel` (pinned wheel)")
        return self


class Target(_Strict):
    model: str  # refspec: a built-in model name or an HF folder; sglang: an HF id or local path
    dtype: Literal["float32", "bfloat16", "float16", "fp8"] = "bfloat16"
    arch: Arch


class Drafter(_Strict):
    kind: Literal["ngram", "dflash2", "dspark", "eagle3"]
    model: str | None = None
    block_size: int = Field(default=8, ge=1, le=64)  # draft positions m per step
    top_k: int = Field(default=16, ge=1, le=64)  # candidates per position in the lattice
    params: int = Field(default=0, ge=0)  # drafter weights, for the cost model's drafter class


class Devices(_Strict):
    kind: Literal["cpu", "h100", "h200", "rtx-pro-6000"]
    slots: list[str] = Field(min_length=1)

    @field_validator("slots")
    @classmethod
    def _slots(cls, slots: list[str]) -> list[str]:
        for slot in slots:
            if not SLOT_RE.match(slot):
                raise ValueError(f"slot {slot!r} is not of the form 'cpu:N' or 'cuda:N'")
        if len(set(slots)) != len(slots):
            raise ValueError("slots must be distinct")
        return slots

    @model_validator(mode="after")
    def _slot_kind(self) -> Devices:
        want = "cpu" if self.kind == "cpu" else "cuda"
        wrong = [s for s in self.slots if not s.startswith(want + ":")]
        if wrong:
            raise ValueError(f"device kind {self.kind!r} needs '{want}:N' slots, got {wrong}")
        return self


class Serving(_Strict):
    shape: Literal["single", "batch"] = "single"
    batch_sizes: list[Annotated[int, Field(gt=0)]] = Field(default_factory=lambda: [1], min_length=1)

    @model_validator(mode="after")
    def _single_is_one(self) -> Serving:
        if self.shape == "single" and self.batch_sizes != [1]:
            raise ValueError("shape 'single' serves one request at a time: batch_sizes must be [1]")
        return self


class Workload(_Strict):
    sets: dict[str, Annotated[int, Field(gt=0)]] = Field(min_length=1)  # benchmark set -> samples
    seed: int = 0
    max_new_tokens: int = Field(default=128, gt=0)
    system_prompt: str | None = None
    thinking: bool = False


class ControllerSettings(_Strict):
    protected: list[str] = Field(default_factory=list)  # paths a candidate diff may not touch
    min_gain: float = Field(default=0.01, ge=0)  # approval: lower bound > min_gain + 2σ
    output_change_gain: float = Field(default=0.03, ge=0)  # ... when the output tokens change
    blocks: int = Field(default=6, ge=3)  # blocks of an A/A (stock noise) comparison
    budget_s: float = Field(default=600.0, gt=0)  # a comparison adds blocks until decided or this long
    max_blocks: int = Field(default=40, ge=3)  # ... or this many blocks
    # A round's comparisons together measure about this long at most: each direction may measure
    # until what is left, less the time to a first look (Phase 0's) for each direction after it, so
    # a marginal direction takes what the clear ones leave (orchestrator/round.py). None: budget_s each.
    round_budget_s: float | None = Field(default=None, gt=0)
    warmup_requests: int = Field(default=1, ge=0)
    # An approval's audit scores at least this many output positions: the run's, topped up with
    # fresh pool requests run untimed (a rare defect may change none of a period's few requests).
    audit_positions: int = Field(default=1024, ge=0)
    # How A and B share the slots (controller/paired.py): "auto" = sliced on CPU slots (both
    # systems on every core, in ~50 ms turns), on GPUs swapped with two slots, interleaved with one.
    design: Literal["auto", "sliced", "swapped", "interleaved"] = "auto"
    # Each system runs in a cgroup of its own (cores, freezer, CPU time over every thread and child);
    # where none can be made the controller refuses to judge. "optional" judges there with affinity,
    # process-group signals and /proc accounting instead, and says so in every verdict (a machine
    # lent without a writable /sys/fs/cgroup, like the H200 this project is lent).
    cgroups: Literal["required", "optional"] = "required"
    # What judged requests are drawn from where the operator registered no held-out prompts: the
    # public sets (secret-tagged), or a pool the controller composes afresh at each Phase 0 by
    # sampling the stock target under a secret seed (controller/composed.py; refspec engines).
    prompts: Literal["public", "composed"] = "public"


class Deployment(_Strict):
    name: str
    description: str
    engine: Literal["refspec", "sglang"]
    stock: Stock
    target: Target
    drafter: Drafter
    devices: Devices
    serving: Serving = Serving()
    workload: Workload
    controller: ControllerSettings = ControllerSettings()
    # Engine launch flags passed through verbatim (e.g. sglang's --attention-backend).
    engine_flags: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not NAME_RE.match(name):
            raise ValueError("use lowercase letters, digits, '.', '_' and '-'")
        return name

    @model_validator(mode="after")
    def _engine_stock(self) -> Deployment:
        if self.engine == "refspec" and self.stock.tree is None:
            raise ValueError("engine 'refspec' runs a built-in stock tree: set stock.tree = 'refspec'")
        if self.engine == "sglang" and self.stock.wheel is None:
            raise ValueError("engine 'sglang' needs a pinned wheel: set stock.wheel = 'sglang==X.Y.Z'")
        if self.engine != "refspec" and self.controller.prompts == "composed":
            raise ValueError("controller.prompts 'composed' samples refspec's stock model; for engine "
                             f"{self.engine!r} use 'public' and register held-out prompts")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _design(self) -> Deployment:
        d = self.controller.design
        if d == "sliced" and self.devices.kind != "cpu":
            raise ValueError("controller.design 'sliced' needs CPU slots (a frozen GPU process's queued kernels "
                             "keep running); use 'swapped' (two slots) or 'interleaved' (one)")  # fmt: skip
        if d == "swapped" and len(self.devices.slots) < 2:
            raise ValueError(
                "controller.design 'swapped' needs two slots in devices.slots; use 'interleaved'"
            )
        return self

    @property
    def groups(self) -> int:
        """Request groups a judged draw holds: one per batch size of a batch deployment, else 1."""
        return len(self.serving.batch_sizes) if self.serving.shape == "batch" else 1

    @property
    def draw_sizes(self) -> dict[str, int]:
        """Prompts of each set one judged draw measures (warm-ups aside): the workload's count for
        each group. The pool it draws from (public set, held-out or composed) must hold at least this."""
        return {name: k * self.groups for name, k in self.workload.sets.items()}

    @property
    def design(self) -> str:
        """The paired design the controller runs (controller.design, 'auto' resolved)."""
        d = self.controller.design
        if d != "auto":
            return d
        if self.devices.kind == "cpu":
            return "sliced"
        return "swapped" if len(self.devices.slots) >= 2 else "interleaved"


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check its spelling against `specpilot deployments show smollm-cpu`)"
        elif e["type"] == "missing":
            msg = "missing required field"
        parts.append(f"field `{field}`: {msg}")
    return "; ".join(parts)


def load_deployment_file(path: Path) -> Deployment:
    """Load and validate one TOML file; any problem is one SpecPilotError naming file and field."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpecPilotError(f"{path}: no such deployment file") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecPilotError(f"{path}: TOML syntax error: {e}") from None
    try:
        dep = Deployment.model_validate(data)
    except ValidationError as e:
        raise SpecPilotError(f"{path}: {_describe(e)}") from None
    if path.suffix == ".toml" and path.stem != dep.name:
        raise SpecPilotError(f"{path}: field `name`: {dep.name!r} must match the file name {path.stem!r}")
    return dep
