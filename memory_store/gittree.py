"""Content-only git trees: the one implementation of SpecPilot's tree hash.

A system is named by the git tree hash of its source tree, and that hash must depend on file
names and bytes only. Blobs are written with `hash-object --no-filters` (no attribute or CRLF
conversion) and every file is entered at mode 100644, so timestamps, umasks and exec bits never
leak in. The workspaces (`workspace.py`) and the memory store (patch stacking, seal-check) both
hash through `write_tree`. Missing blobs go into the repository as one pack (`git fast-import`):
SGLang's stock tree has thousands of files, and as many loose objects cost several times more.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from specpilot.deployments import SpecPilotError
from specpilot.deployments.stock import IGNORED_PARTS

FILE_MODE = "100644"
# The same caches `source_files` skips, as git exclude patterns: a repository whose commits must
# hash like `write_tree` (a workspace) lists them in `info/exclude`.
CACHE_EXCLUDES = [*sorted(IGNORED_PARTS), "*.pyc"]
# Git commands on scratch repositories must not see the user's config (diff.noprefix,
# apply.whitespace, core.autocrlf, ...): they would change deltas and trees.
ISOLATED_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}


class GitError(SpecPilotError):
    """A git command failed; `stderr` holds git's own words. The one git layer: every package runs
    git through `git_bytes` / `git_run`."""

    def __init__(self, args: tuple[str, ...], repo: Path, stderr: str):
        super().__init__(f"git {' '.join(args)} failed in {repo}: {stderr}")
        self.stderr = stderr


def git_bytes(repo: Path, *args: str, input: bytes | None = None, env: dict[str, str] | None = None) -> bytes:
    """Run a git command in `repo` with optional stdin bytes; its raw stdout."""
    proc = subprocess.run(
        ["git", "-C", str(repo), *args],
        input=input,
        capture_output=True,
        env={**os.environ, **(env or {})},
    )
    if proc.returncode != 0:
        raise GitError(args, repo, proc.stderr.decode(errors="replace").strip())
    return proc.stdout


def git_try(
    repo: Path, *args: str, input: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run a git command whose failure is an answer (a merge that conflicts, a patch that does not
    apply, a file a commit lacks); the finished process, whatever its status."""
    cmd = ["git", "-C", str(repo), *args]
    return subprocess.run(cmd, input=input, capture_output=True, env={**os.environ, **(env or {})})


def git_run(repo: Path, *args: str, input: str | None = None, env: dict[str, str] | None = None) -> str:
    """Run a git command in `repo` with optional stdin text; its stdout, stripped."""
    out = git_bytes(repo, *args, input=None if input is None else input.encode(), env=env)
    return out.decode().strip()


def source_files(src: Path) -> Iterator[Path]:
    """The files of a source tree, relative to it, in a stable order, without caches and `.git`.

    A folder that is a git checkout (a workspace worktree) lists what `git add -A` would commit:
    tracked and untracked files minus ignored ones, so its hash equals its commit's tree.
    """
    if (src / ".git").exists():
        try:
            out = git_bytes(src, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
        except GitError as e:
            raise SpecPilotError(
                f"{src} is a git checkout, but git cannot list its files: {e.stderr}"
            ) from None
        names = sorted({n for n in out.decode().split("\0") if n})
        rels = (Path(n) for n in names if (src / n).is_file())
    else:
        rels = (p.relative_to(src) for p in sorted(src.rglob("*")) if p.is_file())
    for rel in rels:
        if not IGNORED_PARTS.intersection(rel.parts) and ".git" not in rel.parts and rel.suffix != ".pyc":
            yield rel


def _missing(repo: Path, shas: list[str], env: dict[str, str] | None) -> set[str]:
    out = git_run(repo, "cat-file", "--batch-check", input="\n".join(shas) + "\n", env=env)
    return {line.split()[0] for line in out.splitlines() if line.endswith(" missing")}


def _fast_import(repo: Path, paths: list[Path], env: dict[str, str] | None) -> list[str]:
    """Store files as blobs in one pack (thousands of loose objects cost far more); their hashes."""
    with tempfile.TemporaryDirectory(prefix="specpilot-import-") as tmp:
        marks, err = Path(tmp) / "marks", Path(tmp) / "stderr"
        cmd = ["git", "-C", str(repo), "-c", "pack.compression=0", "fast-import", "--quiet", "--done",
               "--depth=0", "--big-file-threshold=1k", f"--export-marks={marks}"]  # fmt: skip
        with open(err, "wb") as errfh:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errfh,
                                    env={**os.environ, **(env or {})})  # fmt: skip
            assert proc.stdin is not None
            try:
                for n, path in enumerate(paths, 1):
                    data = path.read_bytes()
                    proc.stdin.write(b"blob\nmark :%d\ndata %d\n" % (n, len(data)) + data + b"\n")
                proc.stdin.write(b"done\n")
                proc.stdin.close()
            except BrokenPipeError:
                pass  # git stopped reading: its exit code and stderr say why
            code = proc.wait()
        if code != 0:
            raise GitError(("fast-import",), repo, err.read_text(errors="replace").strip())
        by_mark = dict(line.split() for line in marks.read_text().splitlines())
        return [by_mark[f":{n}"] for n in range(1, len(paths) + 1)]


def write_blobs(repo: Path, paths: list[Path], env: dict[str, str] | None = None) -> list[str]:
    """The blob hashes of files (raw bytes, no filters), stored in `repo` where it lacks them."""
    shas = git_run(repo, "hash-object", "--no-filters", "--stdin-paths",
                   input="\n".join(str(p) for p in paths), env=env).split()  # fmt: skip
    missing = _missing(repo, shas, env)
    todo = [(p, sha) for p, sha in zip(paths, shas, strict=True) if sha in missing]
    if todo:
        stored = _fast_import(repo, [p for p, _ in todo], env)
        if stored != [sha for _, sha in todo]:
            raise GitError(("fast-import",), repo, "stored blobs do not hash like `git hash-object`")
    return shas


def write_tree(repo: Path, src: Path, env: dict[str, str] | None = None) -> str:
    """Store `src`'s files as blobs and trees in the repository at `repo`; return the root tree hash.

    The tree is built in a throwaway index (never the repository's own), one git call per step
    however many folders the source has.
    """
    if not src.is_dir():
        raise SpecPilotError(f"{src}: no such folder")
    files = list(source_files(src))
    bad = [str(f) for f in files if "\n" in str(f) or "\t" in str(f)]
    if bad:
        raise SpecPilotError(f"{src}: file names with tabs or newlines cannot be stored: {bad[:3]}")
    with tempfile.TemporaryDirectory(prefix="specpilot-index-") as tmp:
        ienv = {**(env or {}), "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if not files:
            return git_run(repo, "mktree", input="", env=env)
        shas = write_blobs(repo, [src / f for f in files], env)
        info = "".join(f"{FILE_MODE} {sha}\t{rel.as_posix()}\0" for rel, sha in zip(files, shas, strict=True))
        git_bytes(repo, "update-index", "-z", "--add", "--index-info", input=info.encode(), env=ienv)
        return git_run(repo, "write-tree", env=ienv)


def safe_extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract a `git archive` tar into `dest`: the "data" filter where Python has it (3.11.4+),
    else the same refusals by hand (absolute or `..` paths, anything but files, folders, links)."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    for m in tar.getmembers():
        names = [m.name, m.linkname] if m.issym() else [m.name]
        if any(n.startswith("/") or ".." in Path(n).parts for n in names) or not (
            m.isreg() or m.isdir() or m.issym()
        ):
            raise SpecPilotError(f"refusing archive member {m.name!r}: not a plain file of a source tree")
    tar.extractall(dest)
