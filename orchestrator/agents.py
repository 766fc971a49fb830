"""Choosing the agent backend of a round: `memory` (offline) or `claude`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from specpilot.agents.memory_backend import MemoryMaster, MemorySubAgent
from specpilot.deployments import SpecPilotError

if TYPE_CHECKING:
    from .round import Round

AGENTS = ("memory", "claude")


def default_agent() -> str:
    """`claude` when an API key is configured, else the offline `memory` agent."""
    return "claude" if os.environ.get("ANTHROPIC_API_KEY") else "memory"


def make_agents(name: str, rnd: Round):
    """(master, sub-agent) of backend `name` for this round."""
    if name == "memory":
        have = set(rnd.state["baseline"]["entries"])
        deltas = {}
        for e in rnd.memory.entries(rnd.dep.engine):
            if e.name not in have:
                try:
                    order = rnd.memory.resolve([e.name])
                except SpecPilotError:
                    continue
                deltas[e.name] = [(x.name, x.delta) for x in order if x.name not in have]
        return MemoryMaster(), MemorySubAgent(deltas)
    if name == "claude":
        raise SpecPilotError("the claude agent backend is not part of this version; use --agent memory")
    raise SpecPilotError(f"unknown agent {name!r}; use one of {', '.join(AGENTS)}")
