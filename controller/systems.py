"""System trees: clean checkouts of exact git trees, and candidates applied as diffs.

The controller never runs code from an agent's worktree. It exports the baseline tree from the
workspace repository into a fresh folder, applies the candidate's `git diff` against the baseline
onto a second fresh export, and checks the result reproduces the candidate's tree hash. A diff
touching a protected path (the serve protocol's measurement points, anything the deployment marks
protected) is refused before anything runs.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specpilot.deployments import SpecPilotError, differing
from specpilot.memory_store import CACHE_EXCLUDES, git_bytes, git_try, safe_extract, write_tree

# Paths every engine protects, besides the deployment's own list.
# SGLang's are its HTTP entry points and the tokenizer manager, where chunks and meta_info are made.
ENGINE_PROTECTED = {
    "refspec": ["refspec/serve.py"],
    "sglang": ["python/sglang/srt/entrypoints", "python/sglang/srt/managers/tokenizer_manager.py"],
}


class CandidateRefused(Exception):
    """The candidate may not be measured (touches a protected path, does not apply...)."""


@dataclass(frozen=True)
class SystemTree:
    tree: str  # git tree hash: the system's name
    path: Path  # a checkout holding exactly that tree


def tree_of(repo: Path, rev: str) -> str:
    try:
        return git_bytes(repo, "rev-parse", "--verify", f"{rev}^{{tree}}").decode().strip()
    except SpecPilotError:
        raise SpecPilotError(
            f"{repo}: no revision {rev!r} (give a branch, tag, commit or tree hash)"
        ) from None


def checkout(repo: Path, rev: str, cache: Path) -> SystemTree:
    """A clean export of `rev`'s tree under `cache/<tree>` (made once, reused, never edited)."""
    tree = tree_of(repo, rev)
    path = cache / tree
    if not path.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".export-"))
        try:
            with tarfile.open(fileobj=io.BytesIO(git_bytes(repo, "archive", "--format=tar", tree))) as tar:
                safe_extract(tar, tmp)
            os.replace(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return SystemTree(tree, path)


def touched_paths(repo: Path, base_tree: str, cand_tree: str) -> list[str]:
    out = git_bytes(repo, "diff", "--name-only", "--no-renames", base_tree, cand_tree).decode()
    return [p for p in out.splitlines() if p]


def _shadows(p: str, module: str) -> bool:
    """Would a file at `p` be imported instead of, or in front of, the module file `module` (x/m.py)?

    A package x/m/, an extension module x/m.<abi>.so, a bytecode file x/m.pyc or
    x/__pycache__/m.*.pyc all take the import of x.m (the import system prefers a package, and an
    unchecked hash-based .pyc is used whatever the source says).
    """
    stem = module.removesuffix(".py")
    folder, _, name = stem.rpartition("/")
    prefix = f"{folder}/" if folder else ""
    return (
        p.startswith(stem + "/")
        or (p.startswith(stem + ".") and p.endswith((".so", ".pyd", ".pyc")))
        or (p.startswith(f"{prefix}__pycache__/{name}.") and p.endswith(".pyc"))
    )


GIT_META = {".gitattributes", ".gitmodules"}  # how git materializes a tree: never a candidate's to change


def protected_hits(paths: list[str], protected: list[str]) -> list[str]:
    """The touched paths that change a protected path or module: equal to or under a protected
    path, a file that would be imported in place of a protected module, any bytecode (never
    part of a source tree: a .pyc can say something else than its source), or git's own files at
    any depth (.gitattributes would make `git archive` export other bytes than the tree judged:
    `ident`, `export-subst`, `export-ignore`)."""

    def hit(p: str, q: str) -> bool:
        q = q.rstrip("/")
        return p == q or p.startswith(q + "/") or (q.endswith(".py") and _shadows(p, q))

    def never(p: str) -> bool:  # whatever is protected
        return p.endswith(".pyc") or "__pycache__" in p.split("/") or p.rsplit("/", 1)[-1] in GIT_META

    return [p for p in paths if never(p) or any(hit(p, q) for q in protected)]


def apply_candidate(
    repo: Path, baseline: SystemTree, cand_rev: str, protected: list[str], cache: Path
) -> SystemTree:
    """The candidate as baseline + its diff, in a fresh export; refused when it touches protected paths."""
    cand_tree = tree_of(repo, cand_rev)
    if cand_tree == baseline.tree:
        raise CandidateRefused("the candidate is identical to the baseline (empty diff)")
    hits = protected_hits(touched_paths(repo, baseline.tree, cand_tree), protected)
    if hits:
        raise CandidateRefused(f"the diff touches protected paths: {', '.join(hits)}")
    path = cache / cand_tree
    if path.is_dir():
        return SystemTree(cand_tree, path)
    diff = git_bytes(repo, "diff", "--binary", "--no-renames", baseline.tree, cand_tree)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".apply-"))
    try:
        # The baseline's export may hold bytecode from earlier runs: never part of a system.
        shutil.copytree(
            baseline.path, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*CACHE_EXCLUDES)
        )
        proc = git_try(tmp, "apply", "--whitespace=nowarn", "-", input=diff)
        if proc.returncode != 0:
            raise CandidateRefused(
                f"the candidate's diff does not apply to the baseline: {proc.stderr.decode().strip()}"
            )
        got = write_tree(repo, tmp)
        if got != cand_tree:
            got_p, want_p = differing(got, cand_tree)
            raise CandidateRefused(f"baseline + diff gives tree {got_p}, not the candidate's {want_p}")
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return SystemTree(cand_tree, path)
