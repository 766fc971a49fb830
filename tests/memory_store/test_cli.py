"""`specpilot memory ...` and `specpilot seal-check` as a user runs them, on the real refspec stock."""

from __future__ import annotations

import json
import os

from sqlalchemy import text

from specpilot.deployments import Home, load_deployment
from specpilot.memory_store import connect
from specpilot.memory_store.stacking import Stacker
from specpilot.memory_store.workspace import Workspace
from tests.conftest import run_cli

from .conftest import edited


def _json(*args, home):
    return json.loads(run_cli("--json", *args, home=home, check=True).stdout)


def test_add_replay_seal_export_import_tamper(backend, home, tmp_path):
    # An entry from a workspace worktree...
    ws, _ = Workspace.init(Home(home), load_deployment("smollm-cpu"))
    wt = ws.add_worktree("r1-d1")
    (wt / "refspec" / "memtest.py").write_text("STEP = 1\n")
    added = _json(
        "memory", "add", "wt-entry", "--worktree", "r1-d1", "-d", "smollm-cpu",
        "--summary", "adds memtest", "--target-factor", "tree", "--contract", "lossless", home=home,
    )  # fmt: skip
    assert (added["files"], added["added"], added["stock_tree"]) == (1, 1, ws.stock_tree)
    # ... and one from a folder on top of it, with metadata from a file.
    src = edited(tmp_path, wt, "src", {"refspec/memtest.py": "STEP = 2\n", ".git": None})
    meta = tmp_path / "meta.json"
    meta.write_text(
        json.dumps({"summary": "retunes STEP", "limits": ["CPU only"], "evidence": [{"gain": 1.0}]})
    )
    _json(
        "memory",
        "add",
        "dir-entry",
        "--dir",
        str(src),
        "--requires",
        "wt-entry",
        "--meta",
        str(meta),
        home=home,
    )

    rows = _json("memory", "list", home=home)
    assert [(r["name"], r["requires"]) for r in rows] == [("dir-entry", ["wt-entry"]), ("wt-entry", [])]
    shown = _json("memory", "show", "wt-entry", "--delta", home=home)
    assert shown["required_by"] == ["dir-entry"] and "+STEP = 1" in shown["delta"]
    assert _json("memory", "graph", home=home) == {
        "nodes": ["dir-entry", "wt-entry"],
        "edges": [["dir-entry", "wt-entry"]],
    }
    assert "dir-entry" in run_cli("memory", "graph", home=home, check=True).stdout

    out = tmp_path / "system"
    rep = _json(
        "memory",
        "replay",
        "-d",
        "smollm-cpu",
        "--entries",
        "dir-entry",
        "--out",
        str(out),
        "--seal",
        home=home,
    )
    assert rep["entries"] == ["wt-entry", "dir-entry"]
    assert (out / "refspec" / "memtest.py").read_text() == "STEP = 2\n"
    with Stacker() as st:
        assert st.hash_dir(out) == st.hash_dir(src) == rep["tree"]

    checks = _json("seal-check", home=home)
    assert [(c["kind"], c["ok"]) for c in checks] == [("entry", True), ("entry", True), ("system", True)]
    assert [c["name"] for c in _json("seal-check", "--entry", "wt-entry", home=home)] == ["wt-entry"]
    assert [c["kind"] for c in _json("seal-check", "--system", rep["tree"][:10], home=home)] == ["system"]

    # Export, import into another home (SQLite), replay there: the same tree.
    bundle = tmp_path / "bundle"
    assert _json("memory", "export", str(bundle), home=home)["entries"] == ["wt-entry", "dir-entry"]
    other = tmp_path / "other"
    env_url = os.environ.pop("SPECPILOT_DB_URL", None)
    try:
        assert _json("memory", "import", str(bundle), home=other)["added"] == ["wt-entry", "dir-entry"]
        again = _json("memory", "replay", "-d", "smollm-cpu", "--entries", "dir-entry", home=other)
    finally:
        if env_url:
            os.environ["SPECPILOT_DB_URL"] = env_url
    assert again["tree"] == rep["tree"]

    # Tamper with a stored delta: seal-check fails, exit 1, and says which.
    db = connect(Home(home))
    with db.session() as s:
        s.execute(
            text(
                "UPDATE entries SET delta = replace(delta, '+STEP = 1', '+STEP = 7') WHERE name = 'wt-entry'"
            )
        )
    db.close()
    proc = run_cli("--json", "seal-check", home=home)
    assert proc.returncode == 1
    bad = {c["name"]: c for c in json.loads(proc.stdout) if not c["ok"]}
    assert "wt-entry" in bad and "rebuilds tree" in bad["wt-entry"]["detail"]
    human = run_cli("seal-check", home=home)
    assert human.returncode == 1 and "FAIL" in human.stdout and "failed" in human.stdout


def test_user_errors_are_one_line_exit_2(home, tmp_path):
    cases = [
        (["memory", "show", "nope"], "no memory entry named 'nope'"),
        (["memory", "add", "x"], "exactly one of --dir PATH or --worktree ID"),
        (["memory", "import", "--builtin", "nope"], "no built-in bundle for engine 'nope'"),
        (["memory", "replay", "-d", "smollm-cpu", "--entries", "ghost"], "no memory entry named 'ghost'"),
        (["memory", "replay", "-d", "qwen27b-h1000"], "unknown deployment 'qwen27b-h1000'"),
        (["seal-check", "--system", "abcdef"], "no sealed system 'abcdef'"),
    ]
    for args, message in cases:
        proc = run_cli(*args, home=home)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, proc.stderr)


def test_missing_requirement_on_the_command_line(home, tmp_path):
    from specpilot.deployments.stock import stock_tree_path

    src = edited(tmp_path, stock_tree_path("refspec"), "src", {"refspec/memtest.py": "A = 1\n"})
    proc = run_cli("memory", "add", "x", "--dir", str(src), "--requires", "ghost", home=home)
    assert proc.returncode == 2 and "requires 'ghost', which is not in the memory" in proc.stderr
    assert run_cli("--json", "memory", "list", home=home, check=True).stdout.strip() == "[]"


def test_empty_memory_seal_check_and_list(home):
    assert "nothing to check" in run_cli("seal-check", home=home, check=True).stdout
    assert "the memory is empty" in run_cli("memory", "list", home=home, check=True).stdout


def test_unreachable_or_locked_database_on_the_command_line(home, tmp_path, monkeypatch):
    import sqlite3

    monkeypatch.setenv("SPECPILOT_DB_URL", f"postgresql://specpilot:hunter2@/memory?host={tmp_path}/none")
    proc = run_cli("memory", "list", home=home)
    assert proc.returncode == 2 and "cannot reach database" in proc.stderr and "hunter2" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1

    monkeypatch.delenv("SPECPILOT_DB_URL")
    monkeypatch.setenv("SPECPILOT_DB_TIMEOUT", "0.1")
    run_cli("memory", "list", home=home, check=True)  # creates the database
    holder = sqlite3.connect(home / "specpilot.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        from specpilot.deployments.stock import stock_tree_path

        src = edited(tmp_path, stock_tree_path("refspec"), "src", {"refspec/memtest.py": "A = 1\n"})
        proc = run_cli("memory", "add", "x", "--dir", str(src), home=home)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert proc.returncode == 2 and "is locked by another process" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert run_cli("--json", "memory", "list", home=home, check=True).stdout.strip() == "[]"
