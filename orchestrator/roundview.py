"""What the round's helpers (agents, sealing) read of a round: a Protocol, so they need not import
the round loop that calls them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from specpilot.deployments import Deployment, Home
from specpilot.memory_store import Memory

from .workspace import Workspace


class RoundView(Protocol):
    dep: Deployment
    home: Home
    number: int
    state: dict[str, Any]
    ws: Workspace
    memory: Memory
    progress: Callable[[str, str], None]
