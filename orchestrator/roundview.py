"""What the round's helpers (agents, sealing) read of a round: its typed state, and a Protocol for
the round itself, so they need not import the round loop that calls them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.memory_store import Memory, Workspace


@dataclass
class Baseline:
    """The system a round starts from: its commit and tree in the workspace, and its entries."""

    commit: str
    tree: str
    entries: list[str]


@dataclass
class RoundState:
    """A round's state, saved (as `to_json()`) to the `rounds` table after every step.

    The per-direction records stay plain data, indexed by the direction's number as a string:
    `directions[i]` (the master's direction + key, slot), `patches[str(i)]` (branch, tree,
    summary, cost — or error), `evaluations[str(i)]` (the verdict's figures)."""

    agent: str
    baseline: Baseline
    agent_options: dict[str, Any] = field(default_factory=dict)
    rounds_left: int = 0  # rounds the master may still plan after this one (told to it)
    width: int | None = None  # directions to plan on a Ray cluster (None: one per set of free slots)
    finished: list[str] = field(default_factory=list)  # the steps done, in order
    phase0: float | None = None  # δ, the stock-vs-AR log-probability gap bound
    costmodel: dict[str, Any] | None = None
    knobs: dict[str, Any] = field(default_factory=dict)
    master: dict[str, Any] | None = None  # the master's transcript, tokens and cost
    directions: list[dict[str, Any]] = field(default_factory=list)
    patches: dict[str, dict[str, Any]] = field(default_factory=dict)
    evaluations: dict[str, dict[str, Any]] = field(default_factory=dict)
    combination: dict[str, Any] | None = None
    combination_eval: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    pictures: list[str] = field(default_factory=list)  # the round's PNGs (orchestrator/plots.py)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RoundState:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown or "baseline" not in data or "agent" not in data:
            raise SpecPilotError(
                f"a stored round state has fields {unknown or 'missing agent/baseline'} this version does "
                "not know; finish that round with the version that started it"
            )
        return cls(**{**data, "baseline": Baseline(**data["baseline"])})


class RoundView(Protocol):
    dep: Deployment
    home: Home
    number: int
    state: RoundState
    ws: Workspace
    memory: Memory
    progress: Callable[[str, str], None]

    def compare(self, baseline: str, candidate: str) -> dict[str, Any]:
        """The controller's verdict on `candidate` against `baseline`, as `sealing.evaluation_json`."""
        ...
