"""Alembic environment: runs on the connection `specpilot.memory_store.db.connect` hands over.

New revision (from the repository root, on a scratch database at the current head):
    alembic -c memory_store/migrations/alembic.ini revision --autogenerate -m "what changed"
then add its id to `REVISIONS` in `memory_store/db.py`.
"""

from __future__ import annotations

from alembic import context

from specpilot.memory_store.db import VERSION_TABLE
from specpilot.memory_store.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    from sqlalchemy import create_engine

    connection = create_engine(config.get_main_option("sqlalchemy.url")).connect()

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    render_as_batch=True,  # SQLite alters tables by copy; batch mode does that for us
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
