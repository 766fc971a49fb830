"""The database: SQLite (WAL) in the home by default, PostgreSQL when SPECPILOT_DB_URL names one.

`connect(home)` opens it and brings its schema to the newest Alembic revision (the migrations ship
in `migrations/` as package data). Writes are serialized where SQLite needs it: every read-write
session on SQLite starts with `BEGIN IMMEDIATE`, so two processes never deadlock upgrading read
locks; PostgreSQL runs at its default READ COMMITTED with a lock timeout. A database that is
locked past SPECPILOT_DB_TIMEOUT seconds (default 30) or cannot be reached is one SpecPilotError.
"""

from __future__ import annotations

import atexit
import os
import random
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlalchemy.orm import Session

from specpilot.deployments import Home, SpecPilotError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "specpilot_schema_version"
REVISIONS = ("0001",)  # every migration in order; the last is the head this code needs
SCHEMA_REVISION = REVISIONS[-1]
_PG_MIGRATION_LOCK = 0x5350_4D53  # advisory lock key ("SPMS"): one migrator at a time


def lock_timeout() -> float:
    raw = os.environ.get("SPECPILOT_DB_TIMEOUT", "30")
    try:
        value = float(raw)
    except ValueError:
        raise SpecPilotError(f"SPECPILOT_DB_TIMEOUT={raw!r} is not a number of seconds") from None
    if value < 0:
        raise SpecPilotError(f"SPECPILOT_DB_TIMEOUT={raw!r} must be >= 0 seconds")
    return value


def database_url(raw: str) -> URL:
    """Parse a database URL; PostgreSQL URLs are pointed at psycopg 3."""
    try:
        url = make_url(raw)
    except ArgumentError:
        raise SpecPilotError(
            f"database URL {raw!r} is not valid; use sqlite:///PATH or postgresql://USER@HOST/DB"
        ) from None
    backend = url.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return url.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if url.drivername != "sqlite" or not url.database or url.database == ":memory:":
            raise SpecPilotError(f"database URL {raw!r}: SQLite needs a file, sqlite:///PATH")
        return url
    raise SpecPilotError(
        f"database URL {url.render_as_string(hide_password=True)!r}: only SQLite and PostgreSQL are "
        "supported (sqlite:///PATH or postgresql://USER@HOST/DB)"
    )


class Database:
    """An open database: `session()` for work, `close()` when done."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.url = engine.url.render_as_string(hide_password=True)
        self.backend = engine.url.get_backend_name()

    @contextmanager
    def session(self, readonly: bool = False) -> Iterator[Session]:
        """A session that commits on success and rolls back on any error.

        `readonly=True` lets SQLite sessions that only read run beside a writer.
        """
        bind = self.engine.execution_options(specpilot_readonly=True) if readonly else self.engine
        with Session(bind, expire_on_commit=False) as s:
            try:
                yield s
                s.commit()
            except OperationalError as e:
                s.rollback()
                raise SpecPilotError(describe_error(e, self.url)) from None
            except BaseException:
                s.rollback()
                raise

    def close(self) -> None:
        """Close the pooled connections (the engine is shared per process and reconnects on use)."""
        self.engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def describe_error(e: DBAPIError, url: str) -> str:
    """One line for a database failure: locked, unreachable, or what the driver said.

    Decided by the driver's error, never by words in the message (which may quote a path).
    """
    orig = e.orig if e.orig is not None else e
    msg = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    sqlstate = getattr(orig, "sqlstate", None)
    sqlite = type(orig).__module__.startswith("sqlite3")
    if sqlstate == "55P03" or (sqlite and msg in ("database is locked", "database table is locked")):
        return (
            f"database {url} is locked by another process (waited {lock_timeout():g} s: {msg}); "
            "let the other specpilot command finish, or raise SPECPILOT_DB_TIMEOUT"
        )
    unreachable = msg == "unable to open database file" if sqlite else sqlstate is None
    if unreachable or e.connection_invalidated:
        return f"cannot reach database {url}: {msg}; check SPECPILOT_DB_URL and that the server is running"
    return f"database {url}: {msg}"


def _sqlite_engine(url: URL) -> Engine:
    Path(url.database or "").expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": lock_timeout()})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see _on_begin)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(lock_timeout() * 1000)}")
        _switch_to_wal(cur)
        cur.execute("PRAGMA foreign_keys = ON")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        readonly = conn.get_execution_options().get("specpilot_readonly", False)
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine


def _switch_to_wal(cur: Any) -> None:
    """PRAGMA journal_mode = WAL, waiting up to the lock timeout as a busy database would.

    A fresh file is in rollback mode, and the switch needs it exclusively: while another
    connection holds a write lock on it (two processes opening a fresh home at once, each
    switching), SQLite answers SQLITE_BUSY at once instead of calling the busy handler, since
    waiting while holding its read lock could deadlock. So the switch is retried, read lock
    dropped, after a short random sleep (two retrying processes do not meet again in step).
    """
    deadline = time.monotonic() + lock_timeout()
    while True:
        try:
            cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            busy = getattr(e, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY  # extended codes too
            if not busy or time.monotonic() >= deadline:
                raise
        time.sleep(random.uniform(0.005, 0.05))


def _pg_engine(url: URL) -> Engine:
    engine = create_engine(url, connect_args={"connect_timeout": 10}, pool_pre_ping=True)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute(f"SET lock_timeout = {int(lock_timeout() * 1000)}")
        dbapi_conn.commit()

    return engine


_ENGINES: dict[tuple[int, str, float], Engine] = {}
atexit.register(lambda: [e.dispose() for e in _ENGINES.values()])


def connect(home: Home, url: str | None = None) -> Database:
    """Open the home's database (or `url`) with its schema at the newest revision."""
    parsed = database_url(url or home.db_url)
    key = (os.getpid(), parsed.render_as_string(hide_password=False), lock_timeout())
    engine = _ENGINES.get(key)
    if engine is None:  # one engine (and pool) per database per process, not one per call
        engine = _sqlite_engine(parsed) if parsed.get_backend_name() == "sqlite" else _pg_engine(parsed)
        _ENGINES[key] = engine
    db = Database(engine)
    try:
        _migrate(db)
    except DBAPIError as e:
        db.close()
        raise SpecPilotError(describe_error(e, db.url)) from None
    except BaseException:
        db.close()
        raise
    return db


def schema_revision(db: Database) -> str | None:
    with db.engine.execution_options(specpilot_readonly=True).connect() as conn:
        if not inspect(conn).has_table(VERSION_TABLE):
            return None
        return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def _migrate(db: Database) -> None:
    current = schema_revision(db)
    if current == SCHEMA_REVISION:
        return
    if current is not None and current not in REVISIONS:
        raise SpecPilotError(
            f"database {db.url} has schema revision {current!r}, newer than this SpecPilot knows "
            f"({SCHEMA_REVISION!r}); upgrade SpecPilot or point SPECPILOT_DB_URL elsewhere"
        )
    from alembic import command  # imported only when a migration is due
    from alembic.config import Config

    # One transaction for the whole upgrade: on SQLite BEGIN IMMEDIATE, on PostgreSQL an advisory
    # lock, so two processes opening a fresh database migrate it once; a failure leaves it as it was.
    with db.engine.begin() as conn:
        if db.backend == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
