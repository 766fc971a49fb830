"""Remove the empty mount points the Claude Code sandbox leaves around a worktree.

The CLI's Bash sandbox (bubblewrap) read-only-binds the places a command could use to plant code
that runs outside it later (`.claude/`, git's `config.worktree`, `remotes`, `objects/info/...`).
bubblewrap needs a file or folder to bind onto, so the CLI creates empty ones where none exist: in
the worktree, in its git folder, in the workspace repository's common git folder and in the main
checkout. They are empty and harmless to git, but they are not ours: after the last run on a
repository finishes, every one of them that did not exist before and is still empty is removed.
Only these known names are touched, and only when empty, so nothing git or an agent wrote can go.
"""

from __future__ import annotations

import os
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path

_GITDIR_STUBS = ("NOTES_MERGE_WORKTREE", "config.worktree", "glab-cli", "remotes", "branches",
                 "info/.claude-sandbox-noreplace", "objects/info/.claude-sandbox-noreplace",
                 "objects/info/alternates", "objects/info/commit-graphs")  # fmt: skip

_lock = threading.Lock()
_active: dict[Path, tuple[int, set[Path]]] = {}  # common git dir -> (runs in progress, stubs to remove)


def git_dirs(worktree: Path) -> tuple[Path | None, Path | None]:
    """(the worktree's own git folder, the repository's common git folder); None when not a git tree."""
    dot = worktree / ".git"
    if dot.is_dir():
        return dot, dot
    if not dot.is_file():
        return None, None
    text = dot.read_text().strip()
    if not text.startswith("gitdir:"):
        return None, None
    gitdir = (worktree / text.removeprefix("gitdir:").strip()).resolve()
    common = gitdir
    if (gitdir / "commondir").is_file():
        common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
    return gitdir, common


def _candidates(worktree: Path) -> set[Path]:
    gitdir, common = git_dirs(worktree)
    out = {worktree / ".claude"}
    for d in {gitdir, common} - {None}:
        out |= {d / name for name in _GITDIR_STUBS}
    if common is not None and common.name == ".git":
        out.add(common.parent / ".claude")  # the main checkout, which the CLI takes for the project
    return out


def _empty(path: Path) -> bool:
    """A zero-byte file, or a folder holding nothing but empty folders (never follows links)."""
    if path.is_symlink():
        return False
    if path.is_file():
        return path.stat().st_size == 0
    if path.is_dir():
        return all(_empty(p) for p in path.iterdir())
    return False


@contextmanager
def cleaned(worktree: Path):
    """Run a block, then remove the sandbox's new empty stubs once no other run uses the repository."""
    _, common = git_dirs(worktree)
    key = common or worktree
    new = {p for p in _candidates(worktree) if not os.path.lexists(p)}
    with _lock:
        count, stubs = _active.get(key, (0, set()))
        _active[key] = (count + 1, stubs | new)
    try:
        yield
    finally:
        with _lock:
            count, stubs = _active.pop(key)
            if count > 1:
                _active[key] = (count - 1, stubs)
                stubs = set()
        for p in sorted(stubs, key=lambda p: -len(p.parts)):
            if _empty(p):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
