"""The controller functions a sub-agent may call, bound to one deployment and baseline.

Each takes the agent's worktree, snapshots it into a git tree object (a private index, so the
agent's own index is untouched) and hands that tree to the controller, which runs it from a clean
export. None of them approves anything.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from specpilot import controller
from specpilot.deployments import Deployment, Home
from specpilot.memory_store import git_bytes, git_run


def snapshot(worktree: Path) -> str:
    """The tree hash of everything in `worktree` now (tracked, new and changed files)."""
    fd, index = tempfile.mkstemp(prefix="specpilot-snap-")
    os.close(fd)
    os.unlink(index)
    try:
        for args in (["read-tree", "HEAD"], ["add", "-A"]):
            git_bytes(worktree, *args, env={"GIT_INDEX_FILE": index})
        return git_run(worktree, "write-tree", env={"GIT_INDEX_FILE": index})
    finally:
        Path(index).unlink(missing_ok=True)


class LocalControllerTools:
    """ControllerTools for the embedded controller of this installation."""

    def __init__(self, dep: Deployment, home: Home, baseline_rev: str):
        self.dep, self.home, self.baseline = dep, home, baseline_rev

    def quick_measure(self, worktree: Path) -> dict[str, Any]:
        """A one-block paired measurement of the worktree against the current system."""
        return controller.quick_compare(self.dep, self.home, self.baseline, snapshot(worktree))

    def quick_audit(self, worktree: Path) -> dict[str, Any]:
        """Token-forcing audit of the worktree's system against stock's Phase 0 figures."""
        return controller.audit_system(self.dep, self.home, snapshot(worktree))

    def profile(self, worktree: Path) -> dict[str, Any]:
        """The cost-model report of the worktree's system."""
        return controller.cost_report(self.dep, self.home, snapshot(worktree), max_requests=4)
