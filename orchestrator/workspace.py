"""Workspaces: one git repository per deployment under `<home>/workspaces/<deployment>/`.

    repo/          the repository; its working tree is the current system (branch `system`)
    worktrees/N/   one git worktree per candidate (a sub-agent's direction)

The pristine stock tree is the commit tagged `stock`. A system is named by its git tree hash,
which depends on file names and bytes only: blobs are written with no filters, every file gets
mode 100644 and `core.fileMode` is off, so timestamps, umasks and exec bits never leak in.
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

import git

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.memory_store.gittree import CACHE_EXCLUDES, git_run, write_tree
from specpilot.memory_store.stock import stock_for

STOCK_TAG = "stock"
SYSTEM_BRANCH = "system"
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


@dataclass
class Workspace:
    root: Path

    @property
    def repo_dir(self) -> Path:
        return self.root / "repo"  # = Home.workspace_repo(name): root is home.workspaces / name

    @property
    def repo(self) -> git.Repo:
        return git.Repo(self.repo_dir)

    @property
    def name(self) -> str:
        return self.root.name

    @classmethod
    def open(cls, home: Home, name: str) -> Workspace:
        root = home.workspaces / name
        if not home.has_workspace(name):
            raise SpecPilotError(
                f"no workspace for deployment {name!r} under {home.workspaces}; "
                f"run `specpilot workspace init --deployment {name}`"
            )
        return cls(root)

    @classmethod
    def init(cls, home: Home, dep: Deployment, source: Path | None = None) -> tuple[Workspace, bool]:
        """Create the deployment's workspace, or check the existing one; returns (ws, created).

        `source` overrides the deployment's stock tree (tests use a small tree of their own).
        """
        src = source or stock_source(dep, home)
        root = home.workspaces / dep.name
        with _locked(home.workspaces / f".{dep.name}.lock"):
            if home.has_workspace(dep.name):
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
        want = write_tree(self.repo_dir, src)
        if want != self.stock_tree:
            raise SpecPilotError(
                f"workspace {self.root} holds stock tree {self.stock_tree[:12]}, but the deployment's stock "
                f"tree is now {want[:12]}; move {self.root} away to start a fresh workspace"
            )

    def tree_hash(self, rev: str = SYSTEM_BRANCH) -> str:
        try:
            return self.repo.commit(rev).tree.hexsha
        except (git.BadName, ValueError):
            raise SpecPilotError(f"workspace {self.name}: no revision {rev!r}") from None

    @property
    def stock_tree(self) -> str:
        return self.tree_hash(STOCK_TAG)

    @property
    def system_tree(self) -> str:
        return self.tree_hash(SYSTEM_BRANCH)

    def worktrees(self) -> list[Path]:
        paths = []
        for line in self.repo.git.worktree("list", "--porcelain").splitlines():
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
        self.repo.git.worktree("add", "-B", f"cand/{name}", str(path), rev)
        return path

    def remove_worktree(self, name: str) -> None:
        path = self.root / "worktrees" / name
        if path.exists():
            self.repo.git.worktree("remove", "--force", str(path))
        self.repo.git.worktree("prune")

    def commit_worktree(self, path: Path, message: str) -> str:
        """Commit everything in a worktree (new files too); returns the commit's tree hash."""
        wt = git.Repo(path)
        wt.git.add("-A")
        if wt.is_dirty(index=True, working_tree=False):
            git_run(path, "commit", "-q", "-m", message, env=IDENTITY)
        return wt.head.commit.tree.hexsha

    def set_system(self, rev: str) -> str:
        """Point `system` at `rev` and check it out in repo/; returns the new system tree hash."""
        repo = self.repo
        sha = repo.commit(rev).hexsha
        repo.git.checkout("-q", "-B", SYSTEM_BRANCH, sha)
        return repo.head.commit.tree.hexsha


def _create_repo(path: Path, src: Path) -> None:
    repo = git.Repo.init(path, initial_branch=SYSTEM_BRANCH)
    with repo.config_writer() as cfg:
        cfg.set_value("core", "fileMode", "false")
        cfg.set_value("core", "autocrlf", "false")
        cfg.set_value("user", "name", IDENTITY["GIT_AUTHOR_NAME"])
        cfg.set_value("user", "email", IDENTITY["GIT_AUTHOR_EMAIL"])
    # Commits of candidate worktrees must hash like the memory store's content-only trees.
    (path / ".git" / "info").mkdir(exist_ok=True)
    (path / ".git" / "info" / "exclude").write_text("\n".join(CACHE_EXCLUDES) + "\n")
    tree = write_tree(path, src)
    commit = git_run(path, "commit-tree", tree, "-m", "stock", env={**IDENTITY, **FIXED_DATES})
    git_run(path, "tag", STOCK_TAG, commit)
    git_run(path, "checkout", "-q", "-B", SYSTEM_BRANCH, commit)
