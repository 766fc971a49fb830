"""Creating an entry from a source tree: its delta against stock + requirements, sealed by tree hash."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from specpilot.deployments import SpecPilotError

from .entry import Entry, EntryMeta, check_name, check_requires
from .stacking import Stacker
from .stock import StockTree
from .store import Memory
from .verify import rebuild_entry, requirements_of


def add_entry(
    memory: Memory,
    name: str,
    source: Path,
    stock: StockTree,
    requires: Sequence[str] = (),
    meta: EntryMeta | None = None,
) -> Entry:
    """Store the code in `source` as entry `name`: a delta relative to `stock` + `requires`.

    `source` is any folder holding the full tree (a workspace worktree, an unpacked system). The
    delta is `git diff` from stock + requirements (application order) to `source`; the entry keeps
    the tree hash of `source`, and is stored only after applying the delta reproduced it. An entry
    with no code change is allowed only when it declares variants (a knob registry of its base).
    """
    check_name(name)
    requires = check_requires(name, list(requires))
    meta = meta or EntryMeta()
    if not source.is_dir():
        raise SpecPilotError(f"{source}: no such folder; pass the tree to store with --dir or --worktree")
    known = memory.by_name()
    if name in known:
        raise SpecPilotError(
            f"memory entry {name!r} already exists; entries are immutable, store the new code under another name"
        )
    with Stacker() as st:
        stock_tree = st.stock_hash(stock)
        draft = Entry(name, stock.engine, stock_tree, requires, delta="", tree="", **meta.fields())
        base = st.build(stock_tree, requirements_of(draft, known))
        tree = st.hash_dir(source)
        delta = st.diff(base, tree)
        if not delta and not draft.variants:
            raise SpecPilotError(
                f"{source} does not differ from stock + {requires or 'no requirements'} (tree {tree[:12]}): "
                "there is no code to store (an entry without code must declare variants)"
            )
        entry = replace(draft, delta=delta, tree=tree)
        rebuild_entry(st, entry, known, [stock])
    memory.insert([entry])
    return memory.get(name)
