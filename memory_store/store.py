"""The memory of one home: entries in its database and the stock trees it can reach.

Reading turns rows into `Entry` dataclasses; writing stores already-verified entries, all of a
call's entries in one transaction (an import either lands whole or not at all). Entries are
immutable once stored: a name is never rebound to other code, and evidence only grows.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import selectinload

from specpilot.deployments import Deployment, Home, SpecPilotError

from .dag import application_order
from .db import Database, connect
from .entry import Entry, Variant
from .models import EntryRow, EvidenceRow, RequirementRow, VariantRow, now
from .stock import StockTree, engine_stocks, stock_for

_LOAD = (
    selectinload(EntryRow.requirements).joinedload(RequirementRow.required),
    selectinload(EntryRow.variants),
    selectinload(EntryRow.evidence),
)


def _to_entry(row: EntryRow) -> Entry:
    return Entry(
        name=row.name,
        engine=row.engine,
        stock_tree=row.stock_tree,
        requires=[r.required.name for r in row.requirements],
        delta=row.delta,
        tree=row.tree,
        summary=row.summary,
        target_factor=row.target_factor,
        variants=[Variant(v.knob, v.file, list(v.values), v.default_value) for v in row.variants],
        contracts=list(row.contracts),
        options=dict(row.options),
        evidence=[dict(e.data) for e in row.evidence],
        limits=list(row.limits),
        unverified=list(row.unverified),
        created_at=row.created_at,
    )


class Memory:
    """Entries and systems of one database; `stocks` adds stock trees beyond the home's own."""

    def __init__(self, db: Database, home: Home, stocks: Sequence[StockTree] = ()):
        self.db = db
        self.home = home
        self._extra = list(stocks)

    # -- stock trees -------------------------------------------------------------------------

    def stocks(self, engine: str) -> list[StockTree]:
        """Every stock tree of `engine` this memory can rebuild from."""
        return [s for s in self._extra if s.engine == engine] + engine_stocks(engine, self.home)

    def stock_for(self, dep: Deployment) -> StockTree:
        return stock_for(dep, self.home)

    # -- reading -----------------------------------------------------------------------------

    def entries(self, engine: str | None = None) -> list[Entry]:
        """All entries (of `engine`), by name."""
        with self.db.session(readonly=True) as s:
            q = select(EntryRow).options(*_LOAD).order_by(EntryRow.name)
            if engine is not None:
                q = q.where(EntryRow.engine == engine)
            return [_to_entry(r) for r in s.scalars(q)]

    def by_name(self) -> dict[str, Entry]:
        return {e.name: e for e in self.entries()}

    def get(self, name: str) -> Entry:
        """One entry; an unknown name is a SpecPilotError suggesting close names."""
        with self.db.session(readonly=True) as s:
            row = s.scalars(select(EntryRow).options(*_LOAD).where(EntryRow.name == name)).one_or_none()
            if row is not None:
                return _to_entry(row)
            names = list(s.scalars(select(EntryRow.name)))
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see `specpilot memory list`"
        raise SpecPilotError(f"no memory entry named {name!r}{hint}")

    def resolve(self, names: Sequence[str], known: dict[str, Entry] | None = None) -> list[Entry]:
        """`names` and everything they require, in application order."""
        known = known if known is not None else self.by_name()
        for n in names:
            if n not in known:
                self.get(n)  # raises with suggestions
        order = application_order(names, {k: e.requires for k, e in known.items()})
        return [known[n] for n in order]

    # -- writing -----------------------------------------------------------------------------

    def insert(self, entries: Sequence[Entry]) -> None:
        """Store verified entries (requirements first) in one transaction; nothing on failure."""
        try:
            with self.db.session() as s:
                ids = {}
                for e in entries:
                    row = _to_row(e)
                    for pos, req in enumerate(e.requires):
                        rid = ids.get(req) or s.scalar(select(EntryRow.id).where(EntryRow.name == req))
                        if rid is None:
                            raise SpecPilotError(
                                f"entry {e.name!r} requires {req!r}, which is not in the memory"
                            )
                        row.requirements.append(RequirementRow(position=pos, required_id=rid))
                    s.add(row)
                    s.flush()
                    ids[e.name] = row.id
        except IntegrityError:
            taken = sorted(set(self.by_name()).intersection(e.name for e in entries))
            raise SpecPilotError(
                f"memory entry {', '.join(taken) or 'of that name'} already exists (stored by another process "
                "meanwhile); entries are immutable, store the new code under another name"
            ) from None

    def add_evidence(self, name: str, item: dict[str, Any]) -> None:
        """Append one piece of evidence (e.g. a reuse on a new deployment) to an entry."""
        with self.db.session() as s:
            entry_id = s.scalar(select(EntryRow.id).where(EntryRow.name == name))
            if entry_id is None:
                raise SpecPilotError(f"no memory entry named {name!r}")
            s.add(
                EvidenceRow(
                    entry_id=entry_id, deployment=item.get("deployment"), data=dict(item), created_at=now()
                )
            )


def _to_row(e: Entry) -> EntryRow:
    created = e.created_at or now()
    return EntryRow(
        name=e.name,
        engine=e.engine,
        stock_tree=e.stock_tree,
        tree=e.tree,
        delta=e.delta,
        summary=e.summary,
        target_factor=e.target_factor,
        contracts=list(e.contracts),
        options=dict(e.options),
        limits=list(e.limits),
        unverified=list(e.unverified),
        created_at=created,
        variants=[
            VariantRow(position=i, knob=v.knob, file=v.file, values=list(v.values), default_value=v.default)
            for i, v in enumerate(e.variants)
        ],
        evidence=[
            EvidenceRow(deployment=ev.get("deployment"), data=dict(ev), created_at=created)
            for ev in e.evidence
        ],
    )


def open_memory(home: Home, url: str | None = None) -> Memory:
    """The memory of `home` (its database at `url`, default the home's), schema migrated."""
    return Memory(connect(home, url), home)
