"""The step profile a system writes with `python -m refspec.profile` (CONTRACTS §5)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specpilot.deployments import SpecPilotError

from .analytic import CLASSES


class _ProfileFile(BaseModel):
    # Engines may add fields (a tree system may report its node budget): kept in `extra`.
    model_config = ConfigDict(extra="allow")

    engine: str
    device: str
    dtype: str
    mode: str
    block_size: int = Field(ge=0)
    rows_per_step: float = Field(gt=0)
    steps: int = Field(gt=0)
    tau: float = Field(gt=0)
    step_wall_s: float = Field(gt=0)
    ar_step_wall_s: float = Field(gt=0)
    context_len: float = Field(ge=0)
    classes: dict[str, float]
    profiled_s: float = Field(ge=0)

    @model_validator(mode="after")
    def _classes(self) -> _ProfileFile:
        unknown = sorted(set(self.classes) - set(CLASSES))
        if unknown:
            raise ValueError(f"unknown kernel classes {unknown}; known: {', '.join(CLASSES)}")
        if any(v < 0 or not math.isfinite(v) for v in self.classes.values()):
            raise ValueError("class times must be finite and >= 0")
        total = sum(self.classes.values())
        if not math.isclose(total, self.profiled_s, rel_tol=1e-3, abs_tol=1e-9):
            raise ValueError(f"profiled_s ({self.profiled_s}) is not the sum of classes ({total})")
        return self


@dataclass
class StepProfile:
    """Mean per-step figures of one system on one slot; times in seconds."""

    engine: str
    device: str
    dtype: str
    mode: str
    block_size: int
    rows_per_step: float
    steps: int
    tau: float
    step_wall_s: float
    ar_step_wall_s: float
    context_len: float
    classes: dict[str, float]
    profiled_s: float
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict, source: str = "profile") -> StepProfile:
        """Validate the JSON form; any problem is one SpecPilotError naming `source` and the field."""
        try:
            m = _ProfileFile.model_validate(data)
        except ValidationError as e:
            parts = []
            for err in e.errors():
                loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
                parts.append(f"field `{loc}`: {err['msg'].removeprefix('Value error, ')}")
            raise SpecPilotError(
                f"{source}: not a step profile (CONTRACTS §5): {'; '.join(parts)}; "
                "regenerate it with `python -m refspec.profile`"
            ) from None
        known = {k: getattr(m, k) for k in _ProfileFile.model_fields}
        return cls(**known, extra=dict(m.model_extra or {}))

    def to_dict(self) -> dict:
        out = asdict(self)
        extra = out.pop("extra")
        return {**extra, **out}


def load_profile(path: Path) -> StepProfile:
    """Read and validate a step profile file."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecPilotError(f"{path}: no such profile file") from None
    except json.JSONDecodeError as e:
        raise SpecPilotError(
            f"{path}: not JSON ({e}); regenerate it with `python -m refspec.profile`"
        ) from None
    if not isinstance(data, dict):
        raise SpecPilotError(f"{path}: a step profile is one JSON object (CONTRACTS §5)")
    return StepProfile.from_dict(data, source=str(path))
