"""Reproduction: an entry survives only if stock + requirements + delta rebuilds its tree exactly.

`rebuild_entry` is the one check behind `memory add` (at creation), `memory import` (before
anything is stored) and `seal-check` (any time later).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specpilot.deployments import SpecPilotError, differing

from .dag import application_order
from .entry import Entry
from .stacking import Stacker
from .stock import StockTree


def find_stock(stacker: Stacker, stocks: Sequence[StockTree], engine: str, tree: str) -> StockTree:
    """The stock tree of `engine` whose content hashes to `tree`; a clear error when none does."""
    found = stacker.find_stock(stocks, tree)
    if found is not None:
        return found
    if not stocks:
        raise SpecPilotError(f"no stock tree of engine {engine!r} is available on this machine")
    now = ", ".join(f"{s.label} = {stacker.stock_hash(s)[:12]}" for s in stocks)
    raise SpecPilotError(
        f"stock tree {tree[:12]} of engine {engine!r} is not available (now: {now}); the stock changed "
        "since the entry was made: rebuild the entry on the new stock"
    )


def requirements_of(entry: Entry, known: Mapping[str, Entry], where: str = "the memory") -> list[Entry]:
    """The entry's requirements, transitively, in application order; all of the same base."""
    graph = {n: e.requires for n, e in known.items()}
    graph[entry.name] = entry.requires
    order = application_order([entry.name], graph, where)[:-1]
    reqs = [known[n] for n in order]
    for r in reqs:
        if (r.engine, r.stock_tree) != (entry.engine, entry.stock_tree):
            raise SpecPilotError(
                f"entry {entry.name!r} ({entry.engine}, stock {entry.stock_tree[:12]}) requires {r.name!r} "
                f"({r.engine}, stock {r.stock_tree[:12]}): requirements must share engine and stock tree"
            )
    return reqs


def rebuild_entry(
    stacker: Stacker,
    entry: Entry,
    known: Mapping[str, Entry],
    stocks: Sequence[StockTree],
    where: str = "the memory",
) -> str:
    """Rebuild `entry` from stock and its requirements and check it: the rebuilt tree hash.

    Raises SpecPilotError when the stock is gone, a requirement is missing, a delta does not
    apply, the rebuilt tree differs from the recorded one, or a variant default does not match.
    """
    find_stock(stacker, stocks, entry.engine, entry.stock_tree)
    reqs = requirements_of(entry, known, where)
    tree = stacker.build(entry.stock_tree, [*reqs, entry])
    if tree != entry.tree:
        got, sealed = differing(tree, entry.tree)
        raise SpecPilotError(
            f"entry {entry.name!r} rebuilds tree {got}, not its sealed tree {sealed}: "
            "its delta or a requirement was changed after sealing"
        )
    stacker.check_variants(tree, entry.variants, entry.name)
    return tree
