"""Systems on the real refspec stock: replay builds them from entries, sealing records them, and
seal-check rebuilds them."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from specpilot.deployments import SpecPilotError, load_deployment
from specpilot.deployments.stock import stock_tree_path
from specpilot.memory_store import add_entry, find_systems, list_systems, replay, seal_check, seal_system
from specpilot.memory_store.stacking import Stacker

from .conftest import edited


@pytest.fixture
def dep():
    return load_deployment("smollm-cpu")


@pytest.fixture
def refspec_entries(memory, dep, tmp_path):
    """Two refspec entries (b requires a) and one independent entry c."""
    stock = memory.stock_for(dep)
    a = edited(tmp_path, stock.path, "a", {"refspec/memtest.py": "A = 1\n"})
    add_entry(memory, "memtest-a", a, stock)
    b = edited(tmp_path, a, "b", {"refspec/memtest.py": "A = 1\nB = 2\n"})
    add_entry(memory, "memtest-b", b, stock, ["memtest-a"])
    add_entry(memory, "memtest-c", edited(tmp_path, stock.path, "c", {"notes/c.txt": "c\n"}), stock)
    return {"a": a, "b": b}


def test_replay_pulls_in_requirements_and_writes_the_tree(memory, dep, refspec_entries, tmp_path):
    out = tmp_path / "system"
    r = replay(memory, dep, ["memtest-b", "memtest-c"], out)
    assert r.entries == ["memtest-a", "memtest-b", "memtest-c"]
    assert (out / "refspec" / "memtest.py").read_text() == "A = 1\nB = 2\n"
    assert (out / "notes" / "c.txt").read_text() == "c\n"
    with Stacker() as st:
        assert st.hash_dir(out) == r.tree
        assert r.stock_tree == st.hash_dir(stock_tree_path("refspec"))
    # Order of the request does not matter when the entries are independent.
    assert replay(memory, dep, ["memtest-c", "memtest-b"]).tree == r.tree
    # No entries: the stock tree itself.
    assert replay(memory, dep, []).tree == r.stock_tree


def test_replay_refuses_a_non_empty_out(memory, dep, refspec_entries, tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("keep")
    with pytest.raises(SpecPilotError, match="not an empty folder"):
        replay(memory, dep, ["memtest-a"], tmp_path / "busy")
    assert (tmp_path / "busy" / "x").read_text() == "keep"


def test_replay_refuses_entries_of_another_engine(memory, dep, toy_stock, tmp_path):
    add_entry(memory, "toy-thing", edited(tmp_path, toy_stock.path, "t", {"x.py": "X = 1\n"}), toy_stock)
    with pytest.raises(SpecPilotError, match="is for engine 'toy'; deployment 'smollm-cpu' runs 'refspec'"):
        replay(memory, dep, ["toy-thing"])


def test_seal_system_and_seal_check(memory, dep, refspec_entries):
    tree = replay(memory, dep, ["memtest-b"]).tree
    rec = seal_system(memory, dep, ["memtest-b"], tree)
    assert (rec.deployment, rec.tree, rec.entries) == ("smollm-cpu", tree, ["memtest-a", "memtest-b"])
    assert list_systems(memory.db) == [rec]
    assert find_systems(memory.db, tree[:8]) == [rec] == find_systems(memory.db, "smollm-cpu")
    results = seal_check(memory)
    assert [(r.kind, r.ok) for r in results] == [("entry", True)] * 3 + [("system", True)]
    # Sealing the same system again keeps one row.
    seal_system(memory, dep, ["memtest-b"], tree)
    assert len(list_systems(memory.db)) == 1


def test_seal_system_refuses_a_tree_its_entries_do_not_build(memory, dep, refspec_entries):
    tree = replay(memory, dep, ["memtest-b"]).tree
    with pytest.raises(SpecPilotError, match="rebuilds tree .*, not the system's tree"):
        seal_system(memory, dep, ["memtest-a"], tree)
    assert list_systems(memory.db) == []


def test_tampered_system_is_caught(memory, dep, refspec_entries):
    tree = replay(memory, dep, ["memtest-b"]).tree
    seal_system(memory, dep, ["memtest-b"], tree)
    with memory.db.session() as s:
        s.execute(text("UPDATE systems SET entries = :e"), {"e": json.dumps(["memtest-a"])})
    [sysres] = [r for r in seal_check(memory) if r.kind == "system"]
    assert not sysres.ok and "rebuild" in sysres.detail and sysres.rebuilt != tree
    with memory.db.session() as s:
        s.execute(text("UPDATE systems SET entries = :e"), {"e": json.dumps(["memtest-a", "gone"])})
    [sysres] = [r for r in seal_check(memory) if r.kind == "system"]
    assert not sysres.ok and "['gone'] are not in the memory" in sysres.detail


def test_unknown_system_ref(memory):
    with pytest.raises(SpecPilotError, match="no sealed system 'abcd'"):
        find_systems(memory.db, "abcd")
