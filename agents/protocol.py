"""The agent protocol (ARCHITECTURE §9): a master plans directions, a sub-agent turns one into a patch.

Backends implement `Master` and `SubAgent`. Directions are pydantic (they cross the edge from an
LLM's structured output); everything else is a plain dataclass. Sub-agents never approve anything:
the `ControllerTools` they may call measure and audit, and the round decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

Factor = Literal["tree", "kernel", "outside", "none"]


class KnobChange(BaseModel):
    """Retune one knob of a variant registry: `knob` is `section.key` in the TOML file `file`."""

    model_config = ConfigDict(extra="forbid")
    knob: str = Field(pattern=r"^[A-Za-z_][\w-]*\.[A-Za-z_][\w-]*$")
    file: str
    value: int | float | str | bool


class Direction(BaseModel):
    """One line of attack for one device slot."""

    model_config = ConfigDict(extra="forbid")
    title: str = Field(min_length=3, max_length=120)
    hypothesis: str = Field(min_length=3)
    target_factor: Factor
    expected_gain: float = Field(ge=0.0, le=10.0)  # fraction: 0.05 = +5%
    plan: str = Field(min_length=3)
    # Set by the offline memory backend: the entry to apply (requirements come with it), or a knob.
    entry: str | None = None
    knob: KnobChange | None = None

    @property
    def key(self) -> str:
        """What makes two directions the same attempt (so a round never repeats a finished one)."""
        if self.entry:
            return f"entry:{self.entry}"
        if self.knob:
            return f"knob:{self.knob.file}:{self.knob.knob}={self.knob.value!r}"
        return f"title:{self.title}"


@dataclass(frozen=True)
class PlanningContext:
    """What the master sees before planning a round."""

    deployment: str
    engine: str
    system_tree: str
    system_entries: list[str]  # entries sealed into the current system
    costmodel: dict[str, Any]  # the cost-model report (JSON form), with its largest factor
    memory: list[dict[str, Any]]  # summaries of memory entries for this engine
    past: list[dict[str, Any]]  # earlier directions with their verdicts and reasons
    slots: list[str]  # free device slots: one direction each
    knobs: dict[str, Any] = field(default_factory=dict)  # "file:section.key" -> the system's value
    budget: dict[str, Any] = field(default_factory=dict)


@dataclass
class Patch:
    """A sub-agent's result: its worktree holds the change; `diff` is what the round collected."""

    direction: Direction
    worktree: Path
    diff: str
    summary: str
    transcript: Path | None = None
    cost_usd: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict)


class ControllerTools(Protocol):
    """Controller functions a sub-agent may call; none of them approves anything."""

    def quick_measure(self, worktree: Path) -> dict[str, Any]: ...
    def quick_audit(self, worktree: Path) -> dict[str, Any]: ...
    def profile(self, worktree: Path) -> dict[str, Any]: ...


class Master(Protocol):
    def plan(self, ctx: PlanningContext) -> list[Direction]: ...


class SubAgent(Protocol):
    def implement(self, direction: Direction, worktree: Path, slot: str, tools: ControllerTools) -> Patch: ...


class AgentError(Exception):
    """An agent produced something unusable (a malformed direction, a patch that fails checks).

    `record` carries what the failed run still left behind (its transcript, cost and usage), so the
    round can store it with the failed direction.
    """

    is_user_error = True
    exit_code = 2

    def __init__(self, message: str, record: dict[str, Any] | None = None):
        super().__init__(message)
        self.record = record or {}
