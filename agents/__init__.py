"""specpilot.agents: who plans directions and writes them as patches (paper §3.3–3.4).

protocol          Direction, Patch, PlanningContext, and the Master / SubAgent protocols
memory_backend    the offline agent: directions from the memory store's knobs, no key needed
tools             the controller tools a sub-agent may call (quick, unjudged measurements)
specpilot.agents.claude   the Claude Code agent (optional install `specpilot[claude]`)
"""

from .memory_backend import MemoryMaster, MemorySubAgent, candidate_directions
from .protocol import (
    AgentError,
    ControllerTools,
    Direction,
    KnobChange,
    Master,
    Patch,
    PlanningContext,
    SubAgent,
)
from .tools import LocalControllerTools

__all__ = ["AgentError", "ControllerTools", "Direction", "KnobChange", "LocalControllerTools", "Master",
           "MemoryMaster", "MemorySubAgent", "Patch", "PlanningContext", "SubAgent", "candidate_directions"]  # fmt: skip
