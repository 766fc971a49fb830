"""Workspaces: one git repository per deployment under `<home>/workspaces/<deployment>/`.

    repo/          the repository; its working tree is the current system (branch `system`)
    worktrees/N/   one git worktree per candidate (a sub-agent's direction), branch `cand/N`
    systems/T/     clean exports of judged trees, by tree hash (written by the controller)

The pristine stock tree is the commit tagged `stock`. A system is named by its git tree hash,
which depends on file names and bytes only (`gittree.write_tree`): every file gets mode 100644,
`core.fileMode` is off and the caches are excluded, so timestamps, umasks, exec bits and bytecode
never leak in. This is the lowest layer that knows the layout: the controller, the memory store's
commands and the orchestrator all open a deployment's repository through `Workspace`.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specpilot.deployments import Deployment, Home, SpecPilotError, differing

from .gittree import CACHE_EXCLUDES, git_run, git_try, write_tree
from .stock import stock_for

STOCK_TAG = "stock"
SYSTEM_BRANCH = "system"
CANDIDATE_PREFIX = "cand/"
IDENTITY = {
    "GIT_AUTHOR_NAME": "SpecPilot",
    "GIT_AUTHOR_EMAIL": "specpilot@localhost",
    "GIT_COMMITTER_NAME": "SpecPilot",
    "GIT_COMMITTER_EMAIL": "specpilot@localhost",
}
# The stock commit's dates are fixed, so the same stock tree gives the same commit everywhere.
FIXED_DATES = {
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}


def stock_source(dep: Deployment, home: Home | None = None) -> Path:
    """The folder holding the deployment's pristine stock tree (the memory store's stock lookup)."""
    return stock_for(dep, home or Home.resolve()).path


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Workspace:
    root: Path  # home.workspaces / <deployment>

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def repo_dir(self) -> Path:
        return self.root / "repo"

    @property
    def systems_cache(self) -> Path:
        return self.root / "systems"

    @staticmethod
    def exists(home: Home, name: str) -> bool:
        return (Workspace(home.workspaces / name).repo_dir / ".git").is_dir()

    @classmethod
    def open(cls, home: Home, name: str) -> Workspace:
        if not cls.exists(home, name):
            raise SpecPilotError(
                f"no workspace for deployment {name!r} under {home.workspaces}; "
                f"run `specpilot workspace init --deployment {name}`"
            )
        return cls(home.workspaces / name)

    @classmethod
    def init(cls, home: Home, dep: Deployment, source: Path | None = None) -> tuple[Workspace, bool]:
        """Create the deployment's workspace, or check the existing one; returns (ws, created).

        `source` overrides the deployment's stock tree (tests use a small tree of their own).
        """
        src = source or stock_source(dep, home)
        root = home.workspaces / dep.name
        with _locked(home.workspaces / f".{dep.name}.lock"):
            if cls.exists(home, dep.name):
                ws = cls(root)
                ws._check_stock(src)
                return ws, False
            tmp = Path(tempfile.mkdtemp(dir=home.workspaces, prefix=f".init-{dep.name}-"))
            try:
                _create_repo(tmp / "repo", src)
                (tmp / "worktrees").mkdir()
                os.replace(tmp, root)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            return cls(root), True

    def _check_stock(self, src: Path) -> None:
        want, have = write_tree(self.repo_dir, src), self.stock_tree
        if want != have:
            have_p, want_p = differing(have, want)
            raise SpecPilotError(
                f"workspace {self.root} holds stock tree {have_p}, but the deployment's stock "
                f"tree is now {want_p}; move {self.root} away to start a fresh workspace"
            )

    def git(self, *args: str) -> str:
        """A git command in the repository (the one git layer); its stdout, stripped."""
        return git_run(self.repo_dir, *args)

    def commit(self, rev: str = SYSTEM_BRANCH) -> str:
        """The commit hash `rev` names."""
        return self._resolve(rev, "^{commit}")

    def tree_hash(self, rev: str = SYSTEM_BRANCH) -> str:
        """The tree hash (the system's name) of `rev`."""
        return self._resolve(rev, "^{tree}")

    def _resolve(self, rev: str, peel: str) -> str:
        proc = git_try(self.repo_dir, "rev-parse", "--verify", "--quiet", rev + peel)
        if proc.returncode != 0:
            raise SpecPilotError(f"workspace {self.name}: no revision {rev!r}")
        return proc.stdout.decode().strip()

    def subject(self, rev: str = SYSTEM_BRANCH) -> str:
        return self.git("log", "-1", "--format=%s", self.commit(rev))

    @property
    def stock_tree(self) -> str:
        return self.tree_hash(STOCK_TAG)

    @property
    def system_tree(self) -> str:
        return self.tree_hash(SYSTEM_BRANCH)

    def branches(self) -> list[str]:
        """Every local branch, `system` and the candidates' `cand/<name>`."""
        out = self.git("for-each-ref", "--format=%(refname:short)", "refs/heads/")
        return sorted(out.splitlines())

    def worktrees(self) -> list[Path]:
        paths = []
        for line in self.git("worktree", "list", "--porcelain").splitlines():
            if line.startswith("worktree "):
                p = Path(line.removeprefix("worktree "))
                if p != self.repo_dir:
                    paths.append(p)
        return paths

    def add_worktree(self, name: str, rev: str = SYSTEM_BRANCH) -> Path:
        """A fresh worktree on a new branch `cand/<name>` starting at `rev`."""
        path = self.root / "worktrees" / name
        if path.exists():
            raise SpecPilotError(f"worktree {path} exists; remove it with `git worktree remove` first")
        self.git("worktree", "add", "-q", "-B", CANDIDATE_PREFIX + name, str(path), rev)
        return path

    def remove_worktree(self, name: str) -> None:
        path = self.root / "worktrees" / name
        if path.exists():
            self.git("worktree", "remove", "--force", str(path))
        self.git("worktree", "prune")

    def commit_worktree(self, path: Path, message: str) -> str:
        """Commit everything in a worktree (new files too); returns the commit's tree hash."""
        git_run(path, "add", "-A")
        if git_try(path, "diff", "--cached", "--quiet").returncode != 0:
            git_run(path, "commit", "-q", "-m", message, env=IDENTITY)
        return git_run(path, "rev-parse", "HEAD^{tree}")

    def set_system(self, rev: str) -> str:
        """Point `system` at `rev` and check it out in repo/; returns the new system tree hash."""
        self.git("checkout", "-q", "-B", SYSTEM_BRANCH, self.commit(rev))
        return self.system_tree


def _create_repo(path: Path, src: Path) -> None:
    path.mkdir(parents=True)
    git_run(path, "init", "-q", f"--initial-branch={SYSTEM_BRANCH}")
    for key, value in (("core.fileMode", "false"), ("core.autocrlf", "false"),
                       ("user.name", IDENTITY["GIT_AUTHOR_NAME"]), ("user.email", IDENTITY["GIT_AUTHOR_EMAIL"])):  # fmt: skip
        git_run(path, "config", key, value)
    # Commits of candidate worktrees must hash like the memory store's content-only trees.
    (path / ".git" / "info").mkdir(exist_ok=True)
    (path / ".git" / "info" / "exclude").write_text("\n".join(CACHE_EXCLUDES) + "\n")
    tree = write_tree(path, src)
    commit = git_run(path, "commit-tree", tree, "-m", "stock", env={**IDENTITY, **FIXED_DATES})
    git_run(path, "tag", STOCK_TAG, commit)
    git_run(path, "checkout", "-q", "-B", SYSTEM_BRANCH, commit)
