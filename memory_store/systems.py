"""Systems: built from stock and chosen entries (replay), and sealed with their entry list and tree.

A sealed system records the entries that rebuild it, in application order, and its tree hash;
`seal-check` recomputes both. The round loop seals every system it promotes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import select

from specpilot.deployments import Deployment, SpecPilotError

from .db import Database
from .entry import Entry
from .models import SystemRow, now
from .stacking import Stacker
from .stock import StockTree
from .store import Memory


@dataclass(frozen=True)
class Replay:
    deployment: str
    stock: StockTree
    stock_tree: str
    entries: list[str]  # application order, requirements pulled in
    tree: str


@dataclass(frozen=True)
class SystemRecord:
    deployment: str
    tree: str
    entries: list[str]
    sealed_at: datetime


def build_system(st: Stacker, stock: StockTree, dep: Deployment, order: Sequence[Entry]) -> str:
    """Stock + `order`'s deltas for deployment `dep`; each entry must be of its engine and stock."""
    stock_tree = st.stock_hash(stock)
    for e in order:
        if e.engine != dep.engine:
            raise SpecPilotError(
                f"entry {e.name!r} is for engine {e.engine!r}; deployment {dep.name!r} runs {dep.engine!r}"
            )
        if e.stock_tree != stock_tree:
            raise SpecPilotError(
                f"entry {e.name!r} was made against stock tree {e.stock_tree[:12]}; deployment {dep.name!r} "
                f"has stock {stock.label} = {stock_tree[:12]}"
            )
    return st.build(stock_tree, order)


def replay(memory: Memory, dep: Deployment, names: Sequence[str], out: Path | None = None) -> Replay:
    """Build the system of `dep`'s stock + `names` (and their requirements); write it to `out`."""
    order = memory.resolve(names)
    stock = memory.stock_for(dep)
    with Stacker() as st:
        tree = build_system(st, stock, dep, order)
        if out is not None:
            st.checkout(tree, out)
        return Replay(dep.name, stock, st.stock_hash(stock), [e.name for e in order], tree)


def seal_system(memory: Memory, dep: Deployment, names: Sequence[str], tree: str) -> SystemRecord:
    """Record that stock + `names` rebuilds system `tree` of `dep`; refused when it does not."""
    rebuilt = replay(memory, dep, names)
    if rebuilt.tree != tree:
        raise SpecPilotError(
            f"stock + {rebuilt.entries or 'no entries'} rebuilds tree {rebuilt.tree[:12]}, not the system's "
            f"tree {tree[:12]}; store the system's missing code as an entry first"
        )
    with memory.db.session() as s:
        row = s.scalar(select(SystemRow).where(SystemRow.deployment == dep.name, SystemRow.tree == tree))
        if row is None:
            row = SystemRow(deployment=dep.name, tree=tree, entries=rebuilt.entries, sealed_at=now())
            s.add(row)
        else:
            row.entries, row.sealed_at = rebuilt.entries, now()
        return _record(row)


def _record(row: SystemRow) -> SystemRecord:
    return SystemRecord(row.deployment, row.tree, list(row.entries), row.sealed_at)


def list_systems(db: Database, deployment: str | None = None) -> list[SystemRecord]:
    with db.session(readonly=True) as s:
        q = select(SystemRow).order_by(SystemRow.sealed_at, SystemRow.id)
        if deployment is not None:
            q = q.where(SystemRow.deployment == deployment)
        return [_record(r) for r in s.scalars(q)]


def find_systems(db: Database, ref: str) -> list[SystemRecord]:
    """Sealed systems named by `ref`: a tree hash (prefix of 4+ hex digits), or a deployment name."""
    systems = list_systems(db)
    hits = [s for s in systems if s.deployment == ref]
    if not hits and len(ref) >= 4:
        hits = [s for s in systems if s.tree.startswith(ref.lower())]
    if not hits:
        raise SpecPilotError(
            f"no sealed system {ref!r}: give a tree hash (4+ hex digits) or a deployment name"
        )
    return hits
