"""Bundles: entries as a folder of `bundle.json` (entries in dependency order) + `<name>.patch` each.

Export writes the chosen entries and everything they require. Import reads and checks the whole
bundle, rebuilds every new entry from stock before storing anything, then stores all of them in
one transaction: a corrupt bundle, a missing requirement, a patch that does not apply or a patch
that does not reproduce its recorded tree leaves the memory as it was. The built-in bundles ship
as package data under `builtin/<engine>/`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from pydantic import ValidationError, field_validator

from specpilot.deployments import SpecPilotError, differing

from .dag import application_order
from .entry import TREE_RE, Entry, EntryMeta, StrictModel, check_name, check_requires, describe
from .evidence import check_evidence
from .sealcheck import SealResult, check_entries
from .stacking import Stacker
from .stock import StockTree
from .store import Memory
from .verify import rebuild_entry, requirements_of

BUNDLE_FILE = "bundle.json"
FORMAT = "specpilot-memory-bundle"
BUILTIN = Path(__file__).resolve().parent / "builtin"
StockLookup = Callable[[str], Sequence[StockTree]]


class BundleEntry(EntryMeta):
    name: str
    engine: str
    stock_tree: str
    requires: list[str] = []
    tree: str
    patch: str

    @field_validator("stock_tree", "tree")
    @classmethod
    def _hash(cls, v: str) -> str:
        if not TREE_RE.match(v):
            raise ValueError(f"{v!r} is not a git tree hash")
        return v


class BundleFile(StrictModel):
    format: Literal["specpilot-memory-bundle"]
    version: Literal[1]
    entries: list[BundleEntry]


def read_bundle(path: Path) -> list[Entry]:
    """The entries of the bundle at `path`, checked for shape, names, patches and order."""
    where = path / BUNDLE_FILE
    if path.is_file():
        raise SpecPilotError(
            f"{path}: a bundle is a folder (the one holding {BUNDLE_FILE}); pass {path.parent}"
        )
    try:
        raw = json.loads(where.read_text())
    except FileNotFoundError:
        raise SpecPilotError(f"{path}: not a bundle (no {BUNDLE_FILE})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecPilotError(f"{where}: corrupt bundle, not valid JSON ({e})") from None
    try:
        bundle = BundleFile.model_validate(raw)
    except ValidationError as e:
        raise SpecPilotError(f"{where}: corrupt bundle: {describe(e)}") from None
    entries: list[Entry] = []
    seen: set[str] = set()
    for b in bundle.entries:
        try:
            check_name(b.name)
            check_requires(b.name, b.requires)
        except SpecPilotError as e:
            raise SpecPilotError(f"{where}: {e}") from None
        if b.name in seen:
            raise SpecPilotError(f"{where}: entry {b.name!r} is listed twice")
        if b.patch != f"{b.name}.patch":
            raise SpecPilotError(
                f"{where}: entry {b.name!r} must keep its delta in {b.name}.patch, not {b.patch!r}"
            )
        try:
            delta = (path / b.patch).read_bytes().decode()
        except FileNotFoundError:
            raise SpecPilotError(f"{path}: corrupt bundle, {b.patch} is missing") from None
        except UnicodeDecodeError:
            raise SpecPilotError(f"{path / b.patch}: corrupt bundle, the patch is not UTF-8 text") from None
        entries.append(Entry(b.name, b.engine, b.stock_tree, list(b.requires), delta, b.tree, **b.fields()))
        seen.add(b.name)
    _check_order(where, entries)
    return entries


def _check_order(where: Path, entries: Sequence[Entry]) -> None:
    pos = {e.name: i for i, e in enumerate(entries)}
    for i, e in enumerate(entries):
        late = [r for r in e.requires if pos.get(r, -1) > i]
        if late:
            graph = {x.name: [r for r in x.requires if r in pos] for x in entries}
            application_order([e.name], graph)  # a cycle raises here, naming it
            raise SpecPilotError(
                f"{where}: entry {e.name!r} comes before its requirement(s) {late}; a bundle lists "
                "entries in dependency order"
            )


def write_bundle(path: Path, entries: Sequence[Entry], force: bool = False) -> None:
    """Write `entries` (dependency order) as a bundle folder, atomically.

    An existing folder is replaced only with `force` and only when it holds nothing but a bundle.
    """
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        extra = (
            [p.name for p in path.iterdir() if p.name != BUNDLE_FILE and p.suffix != ".patch"]
            if path.is_dir()
            else [path.name]
        )
        if not force or extra:
            why = f"it holds other files {extra[:3]}" if extra else "pass --force to replace the bundle in it"
            raise SpecPilotError(f"{path} exists and is not empty; {why}")
    data = {
        "format": FORMAT,
        "version": 1,
        "entries": [
            {k: v for k, v in e.as_dict(delta=False).items() if k != "created_at"}
            | {"patch": f"{e.name}.patch"}
            for e in entries
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        tmp.chmod(0o755)
        (tmp / BUNDLE_FILE).write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
        for e in entries:
            (tmp / f"{e.name}.patch").write_bytes(e.delta.encode())
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export_bundle(
    memory: Memory, path: Path, names: Sequence[str] | None = None, force: bool = False
) -> list[str]:
    """Write `names` (default: every entry) and their requirements to a bundle; the names written."""
    known = memory.by_name()
    chosen = sorted(known) if names is None else list(names)
    if not chosen:
        raise SpecPilotError("the memory holds no entries to export")
    order = memory.resolve(chosen, known)
    write_bundle(path, order, force=force)
    return [e.name for e in order]


@dataclass(frozen=True)
class ImportResult:
    added: list[str]
    present: list[str]  # already in the memory with the same code
    unchecked: list[str] = field(default_factory=list)  # "entry: verdict" this store does not hold


def import_bundle(memory: Memory, path: Path) -> ImportResult:
    """Import a bundle: verify every new entry by rebuilding it, then store all of them at once."""
    entries = read_bundle(path)
    known = memory.by_name()
    new, present = [], []
    for e in entries:
        old = known.get(e.name)
        if old is None:
            new.append(e)
        elif old.same_code(e):
            present.append(e.name)
        else:
            new_tree, old_tree = differing(e.tree, old.tree)
            raise SpecPilotError(
                f"{path}: entry {e.name!r} differs from the memory's entry of that name (tree "
                f"{new_tree} vs {old_tree}); entries are immutable, rename one of them"
            )
    bad, unchecked = check_evidence(memory.db, new)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise SpecPilotError(
            f"{path}: evidence contradicts this store's verdicts: {bad[0]}{more}; an entry's evidence "
            "must be the verdict it names: import the bundle as it was exported, or drop that item"
        )
    pool = {**known, **{e.name: e for e in new}}
    with Stacker() as st:
        for e in new:
            rebuild_entry(st, e, pool, memory.stocks(e.engine), where=f"bundle {path} or the memory")
    try:
        memory.insert(new)
    except SpecPilotError:
        # Another process (a second head on the same database) stored entries of these names
        # meanwhile: the same code counts as present; different code is the usual refusal.
        now = memory.by_name()
        theirs = [e for e in new if e.name in now]
        if not theirs or not all(now[e.name].same_code(e) for e in theirs):
            raise
        mine = [e for e in new if e.name not in now]
        if mine:
            memory.insert(mine)
        return ImportResult([e.name for e in mine], present + [e.name for e in theirs], unchecked)
    return ImportResult([e.name for e in new], present, unchecked)


def check_bundle(path: Path, stocks: StockLookup) -> list[SealResult]:
    """Seal-check a bundle on its own (no database): each entry against stock and the bundle.

    `stocks(engine)` lists the stock trees of an engine (`Memory.stocks`, or `engine_stocks`).
    """
    entries = read_bundle(path)
    by_engine = {eng: list(stocks(eng)) for eng in {e.engine for e in entries}}
    with Stacker() as st:
        return check_entries(st, entries, {e.name: e for e in entries}, by_engine, where=f"bundle {path}")


def builtin_bundles(root: Path = BUILTIN) -> dict[str, Path]:
    """engine -> folder of each built-in bundle shipped with SpecPilot."""
    if not root.is_dir():
        return {}
    return {p.name: p for p in sorted(root.iterdir()) if (p / BUNDLE_FILE).is_file()}


def restock_bundle(path: Path, stocks: StockLookup) -> list[str]:
    """Rebase a bundle's entries onto the current stock tree of their engine (maintainers, after a
    stock change): each delta is re-applied in order and re-diffed against the new base, and
    stock_tree and tree are rewritten. Refused when any delta no longer applies or the engine has
    more than one stock tree. Returns the names rewritten."""
    entries = read_bundle(path)
    done: dict[str, Entry] = {}
    with Stacker() as st:
        for e in entries:
            options = list(stocks(e.engine))
            if len(options) != 1:
                raise SpecPilotError(
                    f"engine {e.engine!r} has {len(options)} stock trees here; restock needs one"
                )
            new_stock = st.stock_hash(options[0])
            moved = replace(e, stock_tree=new_stock)
            base = st.build(new_stock, requirements_of(moved, done, where=f"bundle {path}"))
            tree = st.apply(base, e.delta, e.name)
            fresh = replace(moved, tree=tree, delta=st.diff(base, tree))
            st.check_variants(tree, fresh.variants, fresh.name)
            done[e.name] = fresh
    write_bundle(path, list(done.values()), force=True)
    return list(done)
