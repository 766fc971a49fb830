"""Patch stacking with real git, in a scratch repository.

Stock is hashed into the scratch repository's object store; each entry's delta is applied with
`git apply --cached` to a throwaway index holding the tree so far, and `git write-tree` names the
result. No working files are touched until a tree is checked out on request, so a delta that does
not apply leaves nothing behind. Trees are memoized per (stock, entry sequence), so checking many
entries that share requirements rebuilds each prefix once.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from specpilot.deployments import SpecPilotError, differing

from .entry import Entry, Variant
from .gittree import FILE_MODE, ISOLATED_ENV, GitError, git_bytes, git_run, write_tree
from .stock import StockTree


class Stacker:
    """A scratch git repository for building trees from stock + deltas. Use as a context manager."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="specpilot-stack-")
        self.repo = Path(self._tmp.name) / "repo"
        git_run(Path(self._tmp.name), "init", "-q", "--bare", str(self.repo), env=ISOLATED_ENV)
        self._hashes: dict[Path, str] = {}
        self._built: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}

    def __enter__(self) -> Stacker:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._tmp.cleanup()

    def _git(self, *args: str, input: bytes | None = None, index: str | None = None) -> bytes:
        env = dict(ISOLATED_ENV)
        if index is not None:
            env["GIT_INDEX_FILE"] = index
        return git_bytes(self.repo, *args, input=input, env=env)

    def hash_dir(self, path: Path) -> str:
        """The content-only tree hash of a folder (memoized: stock trees are hashed once)."""
        key = path.resolve()
        if key not in self._hashes:
            self._hashes[key] = write_tree(self.repo, key, env=ISOLATED_ENV)
        return self._hashes[key]

    def stock_hash(self, stock: StockTree) -> str:
        return self.hash_dir(stock.path)

    def find_stock(self, candidates: Sequence[StockTree], tree: str) -> StockTree | None:
        """The candidate whose content hashes to `tree`, if any."""
        return next((s for s in candidates if self.stock_hash(s) == tree), None)

    def apply(self, tree: str, delta: str, name: str) -> str:
        """Apply one entry's delta to `tree`; the resulting tree hash."""
        if not delta:
            return tree
        with tempfile.TemporaryDirectory(prefix="specpilot-apply-") as tmp:
            index = str(Path(tmp) / "index")
            self._git("read-tree", tree, index=index)
            try:
                self._git("apply", "--cached", "--whitespace=nowarn", "-", input=delta.encode(), index=index)
            except GitError as e:
                raise _NotApplied(name, e.stderr) from None
            new = self._git("write-tree", index=index).decode().strip()
        self._check_modes(new, name)
        return new

    def _check_modes(self, tree: str, name: str) -> None:
        # Trees are content-only: a delta that sets an exec bit, a symlink or a submodule would
        # make a tree no folder on disk can reproduce.
        listing = self._git("ls-tree", "-r", "-z", tree).decode()
        odd = [e.split("\t", 1)[1] for e in listing.split("\0") if e and not e.startswith(FILE_MODE + " ")]
        if odd:
            raise SpecPilotError(
                f"the delta of entry {name!r} sets a file mode other than {FILE_MODE} on {odd[:3]}; "
                "SpecPilot trees are content only (no exec bits, symlinks or submodules)"
            )

    def build(self, stock: str, entries: Sequence[Entry]) -> str:
        """Stock + each entry's delta in the given order; the final tree hash.

        `stock` must have been hashed into this stacker first (`stock_hash`/`hash_dir`).
        """
        if stock not in self._hashes.values():
            raise ValueError(
                f"stock tree {stock[:12]} was not hashed into this stacker; call stock_hash first"
            )
        tree = stock
        applied: tuple[tuple[str, str], ...] = ()  # (name, delta): a changed delta never hits the memo
        for e in entries:
            if e.stock_tree != stock:
                made, here = differing(e.stock_tree, stock)
                raise SpecPilotError(f"entry {e.name!r} was made against stock tree {made}, not {here}")
            applied += ((e.name, e.delta),)
            key = (stock, applied)
            if key not in self._built:
                try:
                    self._built[key] = self.apply(tree, e.delta, e.name)
                except _NotApplied as na:
                    raise SpecPilotError(na.describe(applied[:-1])) from None
            tree = self._built[key]
        return tree

    def diff(self, base: str, new: str) -> str:
        """The unified `git diff` from tree `base` to tree `new` (binary-safe, no renames)."""
        args = ["diff", "--binary", "--full-index", "--no-renames", "--no-color", "--no-ext-diff"]
        args += ["--no-textconv", "--src-prefix=a/", "--dst-prefix=b/", base, new]
        out = self._git(*args)
        try:
            return out.decode()
        except UnicodeDecodeError:
            # A text file that is not UTF-8: emit every changed file as a binary patch instead,
            # which is pure ASCII and applies exactly.
            (self.repo / "info").mkdir(exist_ok=True)
            (self.repo / "info" / "attributes").write_text("* -diff\n")
            try:
                return self._git(*args).decode()
            finally:
                (self.repo / "info" / "attributes").unlink()

    def read_file(self, tree: str, path: str) -> bytes | None:
        try:
            return self._git("cat-file", "blob", f"{tree}:{path}")
        except GitError:
            return None

    def check_variants(self, tree: str, variants: Sequence[Variant], name: str) -> None:
        """Each knob's file exists in the entry's tree; in a TOML file the knob holds its default."""
        for v in variants:
            data = self.read_file(tree, v.file)
            if data is None:
                raise SpecPilotError(
                    f"entry {name!r}: variant {v.knob!r} names {v.file!r}, which is not in its tree"
                )
            if not v.file.endswith(".toml"):
                continue
            try:
                value: object = tomllib.loads(data.decode())
                for part in v.knob.split("."):
                    value = value[part]  # type: ignore[index]
            except (tomllib.TOMLDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
                raise SpecPilotError(
                    f"entry {name!r}: variant {v.knob!r} is not a key of {v.file} in its tree ({e})"
                ) from None
            if value != v.default:
                raise SpecPilotError(
                    f"entry {name!r}: variant {v.knob!r} has default {v.default!r}, but {v.file} in its "
                    f"tree sets {value!r}"
                )

    def checkout(self, tree: str, out: Path) -> None:
        """Write `tree`'s files into the new folder `out` (created atomically: all or nothing)."""
        out = out.absolute()  # git runs in the scratch repository, not in our working directory
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise SpecPilotError(f"{out} exists and is not an empty folder; choose another --out")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
        tmp.chmod(0o755)  # mkdtemp makes it private; the tree is an ordinary source folder
        try:
            with tempfile.TemporaryDirectory(prefix="specpilot-co-") as itmp:
                index = str(Path(itmp) / "index")
                self._git("read-tree", tree, index=index)
                self._git("--work-tree", str(tmp), "checkout-index", "-a", "-f", index=index)
            if out.exists():
                out.rmdir()
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def touched_files(delta: str) -> set[str]:
    """The paths a unified diff changes (its `diff --git a/X b/X` headers)."""
    return set(re.findall(r"^diff --git a/(\S+) b/", delta, re.M))


class _NotApplied(SpecPilotError):
    """`git apply` refused an entry's delta; `describe` names the files and the earlier entries."""

    def __init__(self, name: str, stderr: str):
        self.name, self.places = name, {}  # file -> the first line git named in it (or None)
        for line in stderr.splitlines():
            m = re.match(r"error: (?:patch failed: )?(.+?)(?::(\d+))?(?:: .*)?$", line)
            if m and self.places.get(m[1]) is None:
                self.places[m[1]] = m[2]
        super().__init__(self.describe(()))

    def describe(self, before: Sequence[tuple[str, str]]) -> str:
        """One line: where it failed and, if earlier entries of the stack change those files, which."""
        where = ", ".join(f"{f}:{n}" if n else f for f, n in self.places.items()) or "(git named no file)"
        clash = [n for n, d in before if touched_files(d) & set(self.places)]
        if clash:
            names = ", ".join(repr(n) for n in clash)
            return (f"the delta of entry {self.name!r} does not apply at {where} after {names}, which "
                    f"changes the same file: entries {names} and {self.name!r} conflict; make one require "
                    "the other and rebuild it on that tree, or change disjoint files")  # fmt: skip
        return (f"the delta of entry {self.name!r} does not apply at {where}: the tree it lands on differs "
                "from the one it was made against; rebuild the entry")  # fmt: skip
