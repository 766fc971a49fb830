"""The database schema (SQLAlchemy 2 typed ORM), CONTRACTS §7.

Memory tables: `entries`, `requirements` (the DAG's edges, in listed order), `variants`,
`evidence`, `systems`. Records the controller and orchestrator write: `runs`, `verdicts`,
`rounds`, `deployment_state`. Every schema change is an Alembic migration under `migrations/`;
`tests/memory_store/test_db.py` checks that the migrations build exactly this schema.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, String, Text, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

JSONType = JSON().with_variant(JSONB(), "postgresql")
HASH = 64  # room for SHA-256 object names; SHA-1 ones are 40


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every backend (SQLite keeps no zone: store naive UTC)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass an aware one (datetime.now(UTC))")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


def now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSONType, list[Any]: JSONType, datetime: UTCDateTime}


class EntryRow(Base):
    __tablename__ = "entries"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    engine: Mapped[str] = mapped_column(String(32))
    stock_tree: Mapped[str] = mapped_column(String(HASH))
    tree: Mapped[str] = mapped_column(String(HASH))
    delta: Mapped[str] = mapped_column(Text)
    summary: Mapped[str] = mapped_column(Text)
    target_factor: Mapped[str] = mapped_column(String(16))
    contracts: Mapped[list[Any]]
    options: Mapped[dict[str, Any]]
    limits: Mapped[list[Any]]
    unverified: Mapped[list[Any]]
    created_at: Mapped[datetime]

    requirements: Mapped[list[RequirementRow]] = relationship(
        foreign_keys="RequirementRow.entry_id",
        order_by="RequirementRow.position",
        cascade="all, delete-orphan",
    )
    variants: Mapped[list[VariantRow]] = relationship(
        order_by="VariantRow.position", cascade="all, delete-orphan"
    )
    evidence: Mapped[list[EvidenceRow]] = relationship(
        order_by="EvidenceRow.id", cascade="all, delete-orphan"
    )


class RequirementRow(Base):
    """Edge entry -> required entry; `position` keeps the order the entry lists them in."""

    __tablename__ = "requirements"
    __table_args__ = (UniqueConstraint("entry_id", "required_id"),)

    entry_id: Mapped[int] = mapped_column(ForeignKey("entries.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(primary_key=True)
    required_id: Mapped[int] = mapped_column(ForeignKey("entries.id", ondelete="RESTRICT"), index=True)

    required: Mapped[EntryRow] = relationship(foreign_keys=[required_id], lazy="joined")


class VariantRow(Base):
    __tablename__ = "variants"

    entry_id: Mapped[int] = mapped_column(ForeignKey("entries.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(primary_key=True)
    knob: Mapped[str] = mapped_column(String(128))
    file: Mapped[str] = mapped_column(String(512))
    values: Mapped[list[Any]]
    default_value: Mapped[Any] = mapped_column(JSONType, nullable=True)


class EvidenceRow(Base):
    """One piece of evidence: a deployment's gain with its bound, run ids, audits (free-form JSON)."""

    __tablename__ = "evidence"

    id: Mapped[int] = mapped_column(primary_key=True)
    entry_id: Mapped[int] = mapped_column(ForeignKey("entries.id", ondelete="CASCADE"), index=True)
    deployment: Mapped[str | None] = mapped_column(String(128))
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class SystemRow(Base):
    """A sealed system: its tree hash and the entries (application order) that rebuild it."""

    __tablename__ = "systems"
    __table_args__ = (UniqueConstraint("deployment", "tree"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    deployment: Mapped[str] = mapped_column(String(128), index=True)
    tree: Mapped[str] = mapped_column(String(HASH), index=True)
    entries: Mapped[list[Any]]
    sealed_at: Mapped[datetime]


class RunRow(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    baseline_tree: Mapped[str] = mapped_column(String(HASH))
    candidate_tree: Mapped[str | None] = mapped_column(String(HASH))
    status: Mapped[str] = mapped_column(String(16))
    raw_path: Mapped[str | None] = mapped_column(Text)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]


class VerdictRow(Base):
    __tablename__ = "verdicts"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(128), index=True)
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id", ondelete="RESTRICT"), index=True)
    baseline_tree: Mapped[str] = mapped_column(String(HASH))
    candidate_tree: Mapped[str] = mapped_column(String(HASH))
    approved: Mapped[bool]
    changes_output: Mapped[bool]
    gain: Mapped[float]
    lower_bound: Mapped[float]
    sigma: Mapped[float]
    threshold: Mapped[float]
    unit: Mapped[str] = mapped_column(String(16))
    reasons: Mapped[list[Any]]
    evidence: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class RoundRow(Base):
    __tablename__ = "rounds"
    __table_args__ = (UniqueConstraint("deployment", "number"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    deployment: Mapped[str] = mapped_column(String(128))
    number: Mapped[int]
    status: Mapped[str] = mapped_column(String(16))
    state: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class DeploymentStateRow(Base):
    """Per-deployment figures that outlive a run: Phase 0's δ, stock mismatch rate, σ."""

    __tablename__ = "deployment_state"

    deployment: Mapped[str] = mapped_column(String(128), primary_key=True)
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    value: Mapped[Any] = mapped_column(JSONType, nullable=True)
    updated_at: Mapped[datetime]
