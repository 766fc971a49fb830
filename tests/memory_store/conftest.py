"""Memory-store fixtures: every database test runs on SQLite and on a real PostgreSQL.

PostgreSQL tests need SPECPILOT_TEST_PG_URL (a server `.ci/run` starts; locally:
`source .ci/postgres.sh`); each test gets its own schema, dropped afterwards. Stock trees made
here are small folders of this test's own; the CLI tests use the real refspec stock tree.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from specpilot.deployments import Home
from specpilot.memory_store import Memory, StockTree, connect

PG_URL = os.environ.get("SPECPILOT_TEST_PG_URL")
BACKENDS = [
    "sqlite",
    pytest.param(
        "postgresql",
        marks=[
            pytest.mark.postgres,
            pytest.mark.skipif(
                not PG_URL, reason="SPECPILOT_TEST_PG_URL is not set (source .ci/postgres.sh)"
            ),
        ],
    ),
]


def _libpq(url: str) -> str:
    """The psycopg connection string of a SQLAlchemy-style URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, home: Path) -> Iterator[str]:
    """The database backend of this test; SPECPILOT_DB_URL points there (subprocesses too)."""
    if request.param == "sqlite":
        monkeypatch.delenv("SPECPILOT_DB_URL", raising=False)
        yield "sqlite"
        return
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq(PG_URL), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    monkeypatch.setenv("SPECPILOT_DB_URL", url.render_as_string(hide_password=False))
    try:
        yield "postgresql"
    finally:
        with psycopg.connect(_libpq(PG_URL), autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def make_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    """A folder holding exactly `files` (path -> text or bytes)."""
    if root.exists():
        shutil.rmtree(root)
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    return root


TOY_FILES = {
    "toy.toml": '[decode]\nblock_size = 8\nmode = "spec"\n\n[drafter]\nmax_ngram = 4\n',
    "toy/__init__.py": "VERSION = 1\n",
    "toy/engine.py": "def step(x):\n    return x + 1\n\n\ndef verify(chain):\n    return chain[:1]\n",
}


@pytest.fixture
def toy_stock(tmp_path: Path) -> StockTree:
    """A small stock tree of the engine "toy"."""
    return StockTree("toy", make_tree(tmp_path / "stock-toy", TOY_FILES), "toy (test)")


@pytest.fixture
def memory(backend: str, home: Path, toy_stock: StockTree) -> Iterator[Memory]:
    """The memory of a fresh home on this test's backend, with the toy stock reachable."""
    h = Home(home)
    db = connect(h)
    try:
        yield Memory(db, h, stocks=[toy_stock])
    finally:
        db.close()


def edited(tmp_path: Path, base: Path, name: str, changes: dict[str, str | bytes | None]) -> Path:
    """A copy of `base` with `changes` applied (None deletes the file)."""
    out = tmp_path / name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)
    for rel, content in changes.items():
        p = out / rel
        if content is None:
            p.unlink()
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    return out
