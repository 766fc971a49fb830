"""The database layer: migrations, SQLite WAL, and one clear error for locked or unreachable
databases."""

from __future__ import annotations

import sqlite3

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from specpilot.deployments import Home, SpecPilotError
from specpilot.memory_store import connect
from specpilot.memory_store.db import MIGRATIONS, REVISIONS, VERSION_TABLE, schema_revision
from specpilot.memory_store.models import Base

from .conftest import BACKENDS

TABLES = {
    "entries", "requirements", "variants", "evidence", "systems",
    "runs", "verdicts", "rounds", "deployment_state", VERSION_TABLE,
}  # fmt: skip


def test_migrations_build_exactly_the_models(memory):
    with memory.db.engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) >= TABLES
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": VERSION_TABLE})
        assert compare_metadata(ctx, Base.metadata) == []
    assert schema_revision(memory.db) == REVISIONS[-1]


def test_revisions_list_matches_the_migrations_folder():
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    script = ScriptDirectory.from_config(cfg)
    walked = [s.revision for s in script.walk_revisions()]  # head first
    assert tuple(reversed(walked)) == REVISIONS


def test_sqlite_is_wal_with_foreign_keys(tmp_path):
    db = connect(Home(tmp_path))
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    db.close()
    assert (tmp_path / "specpilot.db").is_file()


def test_locked_sqlite_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_DB_TIMEOUT", "0.2")
    path = tmp_path / "specpilot.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process mid-write, before the schema exists
    with pytest.raises(
        SpecPilotError, match=r"is locked by another process \(waited 0.2 s.*SPECPILOT_DB_TIMEOUT"
    ):
        connect(Home(tmp_path))
    holder.execute("ROLLBACK")
    db = connect(Home(tmp_path))  # once free, it opens
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(SpecPilotError, match="is locked by another process"), db.session() as s:
        s.execute(text("INSERT INTO deployment_state VALUES ('d', 'k', '1', '2000-01-01')"))
    holder.execute("ROLLBACK")
    with db.session(readonly=True) as s:
        assert s.execute(text("SELECT count(*) FROM deployment_state")).scalar() == 0
    db.close()
    holder.close()


def test_unreachable_postgres_is_one_clear_error(tmp_path):
    url = f"postgresql://nobody:secret@/specpilot?host={tmp_path}/no-server&port=5999"
    with pytest.raises(SpecPilotError, match="cannot reach database .*check SPECPILOT_DB_URL") as err:
        connect(Home(tmp_path), url)
    assert "secret" not in str(err.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u@h/db", "only SQLite and PostgreSQL"),
        ("sqlite://", "SQLite needs a file"),
        ("sqlite:///:memory:", "SQLite needs a file"),
        ("not a url", "is not valid"),
    ],
)
def test_bad_urls(tmp_path, url, message):
    with pytest.raises(SpecPilotError, match=message):
        connect(Home(tmp_path), url)


def test_not_a_database_file(tmp_path):
    (tmp_path / "specpilot.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(SpecPilotError, match="file is not a database"):
        connect(Home(tmp_path))


def test_newer_schema_is_refused(memory):
    with memory.db.session() as s:
        s.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    with pytest.raises(SpecPilotError, match="schema revision '9999', newer than this SpecPilot knows"):
        connect(memory.home)


def test_failed_migration_leaves_the_database_as_it_was(tmp_path):
    path = tmp_path / "specpilot.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE rounds (x INTEGER)")  # in the way of the initial migration
    with pytest.raises(SpecPilotError, match="already exists"):
        connect(Home(tmp_path))
    with sqlite3.connect(path) as raw:
        names = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert names == {"rounds"}


@pytest.mark.parametrize("backend", [BACKENDS[1]], indirect=True)  # SQLite locking is tested above
def test_locked_postgres_table_is_one_clear_error(memory, monkeypatch):
    import os

    import psycopg
    from sqlalchemy.engine import make_url

    from specpilot.memory_store import records

    monkeypatch.setenv("SPECPILOT_DB_TIMEOUT", "0.2")
    url = make_url(os.environ["SPECPILOT_DB_URL"]).set(drivername="postgresql")
    db = connect(memory.home)  # opened after the timeout change: its lock_timeout is 0.2 s
    with psycopg.connect(url.render_as_string(hide_password=False)) as holder:
        holder.execute("LOCK TABLE deployment_state IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(SpecPilotError, match=r"is locked by another process \(waited 0.2 s"):
            records.set_state(db, "smollm-cpu", "delta", 0.25)
        holder.rollback()
    records.set_state(db, "smollm-cpu", "delta", 0.25)
    assert records.get_state(db, "smollm-cpu", "delta") == 0.25
    db.close()
