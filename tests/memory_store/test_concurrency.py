"""Two processes adding entries to one fresh database at the same time lose nothing."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import sqlalchemy

from specpilot.deployments import Home
from specpilot.memory_store import Memory, connect, seal_check

from .conftest import edited

WORKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from specpilot.deployments import Home, SpecPilotError
    from specpilot.memory_store import Memory, StockTree, add_entry, connect

    home, stock_dir, trees, tag, go = sys.argv[1:6]
    while not Path(go).exists():  # start together
        time.sleep(0.005)
    memory = Memory(connect(Home(Path(home))), Home(Path(home)), [StockTree("toy", Path(stock_dir), "toy")])
    out = {"added": [], "refused": []}
    for name, tree in json.loads(trees):
        try:
            add_entry(memory, name, Path(tree), memory.stocks("toy")[0])
            out["added"].append(name)
        except SpecPilotError as e:
            out["refused"].append([name, str(e)])
    print(json.dumps(out))
    """
)


def test_two_processes_add_at_once(backend, home, toy_stock, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    go = tmp_path / "go"
    jobs = {}
    for tag in ("p", "q"):
        trees = [
            (
                f"{tag}-{i}",
                str(edited(tmp_path, toy_stock.path, f"{tag}{i}", {f"toy/{tag}{i}.py": f"I = {i}\n"})),
            )
            for i in range(4)
        ]
        # Both also try the same name with different code: exactly one may win.
        trees.append(
            ("contested", str(edited(tmp_path, toy_stock.path, f"c{tag}", {"toy/c.py": f"W = '{tag}'\n"})))
        )
        jobs[tag] = trees
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(home),
                str(toy_stock.path),
                json.dumps(jobs[tag]),
                tag,
                str(go),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in jobs
    ]
    time.sleep(0.5)  # both are importing and waiting
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out))

    added = sorted(n for r in results for n in r["added"])
    refused = [x for r in results for x in r["refused"]]
    assert added == sorted(["contested"] + [f"{t}-{i}" for t in "pq" for i in range(4)])
    assert len(refused) == 1 and refused[0][0] == "contested" and "already exists" in refused[0][1]

    h = Home(home)
    memory = Memory(connect(h), h, stocks=[toy_stock])
    assert sorted(e.name for e in memory.entries()) == added
    assert all(r.ok for r in seal_check(memory))
    memory.db.close()


def test_opening_a_fresh_sqlite_file_waits_out_a_writer_that_holds_it(home, monkeypatch):
    """Switching a fresh (rollback-journal) file to WAL needs it exclusively; while another
    connection holds a write lock SQLite answers "database is locked" at once, busy_timeout or not
    (two processes opening a fresh home at once meet this). `connect` waits it out."""
    monkeypatch.delenv("SPECPILOT_DB_URL", raising=False)
    monkeypatch.setenv("SPECPILOT_DB_TIMEOUT", "10")
    path = home / "specpilot.db"
    home.mkdir(parents=True)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # a writer on the fresh file, still in rollback mode
    release = threading.Timer(0.5, other.rollback)
    release.start()
    t = time.monotonic()
    try:
        db = connect(Home(home))
    finally:
        release.join()
        other.close()
    assert time.monotonic() - t >= 0.4  # it waited for the writer, then opened
    with db.session() as s:
        assert s.execute(sqlalchemy.text("PRAGMA journal_mode")).scalar() == "wal"
    assert Memory(db, Home(home), stocks=[]).entries() == []
    db.close()
