"""The sub-agent's patch, collected from its worktree and checked again after the run.

The hook and the sandbox keep writes inside the worktree; this is the check on what is inside:
the diff must be non-empty, touch no protected path (the controller's measurement points), stay
under the size limit, and add no symbolic link that leads out of the tree (a system is plain files).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from specpilot import controller
from specpilot.memory_store import git_bytes

from ..protocol import AgentError

SCRATCH = ".scratch"  # the agent's scratch folder inside its worktree; deleted before collecting


def _git(worktree: Path, *args: str) -> str:
    return git_bytes(worktree, *args).decode()


def collect(worktree: Path) -> str:
    """Stage everything in the worktree (new files too) and return the diff against its base."""
    shutil.rmtree(worktree / SCRATCH, ignore_errors=True)
    _git(worktree, "add", "-A")
    return _git(worktree, "diff", "--cached", "--binary", "--no-renames")


def check(
    worktree: Path, diff: str, protected: list[str], max_bytes: int, record: dict | None = None
) -> None:
    """Raise AgentError (carrying the run's record) when the staged patch breaks a rule."""
    if not diff.strip():
        raise AgentError("the sub-agent changed nothing in its worktree", record)
    size = len(diff.encode())
    if size > max_bytes:
        raise AgentError(f"the patch is {size} bytes, over the limit of {max_bytes} bytes", record)
    touched = [p for p in _git(worktree, "diff", "--cached", "--name-only", "--no-renames").splitlines() if p]
    hits = controller.protected_hits(touched, protected)
    if hits:
        raise AgentError(f"the patch touches protected paths: {', '.join(hits)} (the controller's "
                         "measurement points and the deployment's protected files may not change)", record)  # fmt: skip
    root = Path(os.path.realpath(worktree))
    for line in _git(worktree, "diff", "--cached", "--raw", "--no-renames").splitlines():
        meta, _, path = line.partition("\t")
        if meta.split()[1:2] == ["120000"] and path:
            target = Path(os.path.realpath(worktree / path))
            if target != root and root not in target.parents:
                raise AgentError(f"the patch adds a symbolic link {path} -> {os.readlink(worktree / path)} "
                                 "that leads out of the tree", record)  # fmt: skip
