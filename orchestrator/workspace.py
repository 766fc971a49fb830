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
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import git

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.deployments.stock import stock_tree_path, tree_files

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


def stock_source(dep: Deployment) -> Path:
    """The folder holding the deployment's pristine stock tree."""
    if dep.stock.tree is not None:
        return stock_tree_path(dep.stock.tree)
    raise SpecPilotError(
        f"deployment {dep.name!r}: stock wheel {dep.stock.wheel} cannot be materialized yet "
        "(the SGLang engine is not built in this version); use a refspec deployment such as smollm-cpu"
    )


def git_run(repo: Path, *args: str, input: str | None = None, env: dict | None = None) -> str:
    """Run a git plumbing command in `repo` with optional stdin; its stdout, stripped."""
    proc = subprocess.run(
        ["git", "-C", str(repo), *args],
        input=input,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def write_tree(repo: Path, src: Path) -> str:
    """Store `src`'s files as blobs and trees in the repository at `repo`; return the root tree hash."""
    files = list(tree_files(src))
    paths = "\n".join(str(src / f) for f in files)
    shas = (
        git_run(repo, "hash-object", "-w", "--no-filters", "--stdin-paths", input=paths).split()
        if files
        else []
    )
    entries: dict[Path, list[str]] = {}
    for rel, sha in zip(files, shas, strict=True):
        entries.setdefault(rel.parent, []).append(f"100644 blob {sha}\t{rel.name}")
    # Build subtrees bottom-up: deepest folders first, each parent gets a `tree` entry.
    dirs = sorted({p for f in files for p in f.parents}, key=lambda p: len(p.parts), reverse=True)
    if not dirs:
        return git_run(repo, "mktree", input="")
    for d in dirs:
        tree_sha = git_run(repo, "mktree", input="\n".join(entries.get(d, [])) + "\n")
        if d != Path("."):
            entries.setdefault(d.parent, []).append(f"040000 tree {tree_sha}\t{d.name}")
    return tree_sha


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
    def repo(self) -> git.Repo:
        return git.Repo(self.root / "repo")

    @property
    def name(self) -> str:
        return self.root.name

    @classmethod
    def open(cls, home: Home, name: str) -> Workspace:
        root = home.workspaces / name
        if not (root / "repo" / ".git").is_dir():
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
        src = source or stock_source(dep)
        root = home.workspaces / dep.name
        with _locked(home.workspaces / f".{dep.name}.lock"):
            if (root / "repo" / ".git").is_dir():
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
        want = write_tree(self.root / "repo", src)
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
                if p != self.root / "repo":
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
    tree = write_tree(path, src)
    commit = git_run(path, "commit-tree", tree, "-m", "stock", env={**IDENTITY, **FIXED_DATES})
    git_run(path, "tag", STOCK_TAG, commit)
    git_run(path, "checkout", "-q", "-B", SYSTEM_BRANCH, commit)
