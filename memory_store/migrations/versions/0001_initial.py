"""Initial schema: memory entries and their DAG, systems, and the controller's records.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
HASH = 64


def _indexes(table: str, *columns: str) -> None:
    with op.batch_alter_table(table) as batch:
        for col in columns:
            batch.create_index(f"ix_{table}_{col}", [col], unique=False)


def upgrade() -> None:
    op.create_table(
        "entries",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("stock_tree", sa.String(HASH), nullable=False),
        sa.Column("tree", sa.String(HASH), nullable=False),
        sa.Column("delta", sa.Text(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("target_factor", sa.String(16), nullable=False),
        sa.Column("contracts", JSON, nullable=False),
        sa.Column("options", JSON, nullable=False),
        sa.Column("limits", JSON, nullable=False),
        sa.Column("unverified", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "requirements",
        sa.Column(
            "entry_id", sa.Integer(), sa.ForeignKey("entries.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("position", sa.Integer(), primary_key=True),
        sa.Column(
            "required_id", sa.Integer(), sa.ForeignKey("entries.id", ondelete="RESTRICT"), nullable=False
        ),
        sa.UniqueConstraint("entry_id", "required_id"),
    )
    _indexes("requirements", "required_id")
    op.create_table(
        "variants",
        sa.Column(
            "entry_id", sa.Integer(), sa.ForeignKey("entries.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("position", sa.Integer(), primary_key=True),
        sa.Column("knob", sa.String(128), nullable=False),
        sa.Column("file", sa.String(512), nullable=False),
        sa.Column("values", JSON, nullable=False),
        sa.Column("default_value", JSON, nullable=True),
    )
    op.create_table(
        "evidence",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("entry_id", sa.Integer(), sa.ForeignKey("entries.id", ondelete="CASCADE"), nullable=False),
        sa.Column("deployment", sa.String(128), nullable=True),
        sa.Column("data", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    _indexes("evidence", "entry_id")
    op.create_table(
        "systems",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("deployment", sa.String(128), nullable=False),
        sa.Column("tree", sa.String(HASH), nullable=False),
        sa.Column("entries", JSON, nullable=False),
        sa.Column("sealed_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("deployment", "tree"),
    )
    _indexes("systems", "deployment", "tree")
    op.create_table(
        "runs",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("deployment", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("baseline_tree", sa.String(HASH), nullable=False),
        sa.Column("candidate_tree", sa.String(HASH), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("raw_path", sa.Text(), nullable=True),
        sa.Column("summary", JSON, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
    )
    _indexes("runs", "deployment")
    op.create_table(
        "verdicts",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("deployment", sa.String(128), nullable=False),
        sa.Column("run_id", sa.String(36), sa.ForeignKey("runs.id", ondelete="RESTRICT"), nullable=True),
        sa.Column("baseline_tree", sa.String(HASH), nullable=False),
        sa.Column("candidate_tree", sa.String(HASH), nullable=False),
        sa.Column("approved", sa.Boolean(), nullable=False),
        sa.Column("changes_output", sa.Boolean(), nullable=False),
        sa.Column("gain", sa.Double(), nullable=False),
        sa.Column("lower_bound", sa.Double(), nullable=False),
        sa.Column("sigma", sa.Double(), nullable=False),
        sa.Column("threshold", sa.Double(), nullable=False),
        sa.Column("unit", sa.String(16), nullable=False),
        sa.Column("reasons", JSON, nullable=False),
        sa.Column("evidence", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    _indexes("verdicts", "deployment", "run_id")
    op.create_table(
        "rounds",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("deployment", sa.String(128), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("state", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("deployment", "number"),
    )
    op.create_table(
        "deployment_state",
        sa.Column("deployment", sa.String(128), primary_key=True),
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("value", JSON, nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    for table in ("deployment_state", "rounds", "verdicts", "runs", "systems", "evidence", "variants"):
        op.drop_table(table)
    op.drop_table("requirements")
    op.drop_table("entries")
