"""seal-check: every reproduction is recomputed; tampering with a stored delta or tree is caught."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from specpilot.deployments import SpecPilotError
from specpilot.memory_store import add_entry, seal_check
from specpilot.memory_store.stacking import Stacker

from .conftest import edited
from .test_entries import FAST, TREE_VERIFY


@pytest.fixture
def two(memory, toy_stock, tmp_path):
    a = edited(tmp_path, toy_stock.path, "a", {"toy/engine.py": FAST})
    add_entry(memory, "fast-step", a, toy_stock)
    add_entry(
        memory,
        "tree-verify",
        edited(tmp_path, a, "b", {"toy/engine.py": TREE_VERIFY}),
        toy_stock,
        ["fast-step"],
    )
    return memory


def _sql(memory, statement: str, **params) -> None:
    with memory.db.session() as s:
        s.execute(text(statement), params)


def test_clean_memory_passes(two):
    results = seal_check(two)
    assert [(r.kind, r.name, r.ok) for r in results] == [
        ("entry", "fast-step", True),
        ("entry", "tree-verify", True),
    ]
    assert all(r.rebuilt == r.tree for r in results)


def test_tampered_delta_is_caught(two):
    delta = two.get("fast-step").delta
    _sql(
        two,
        "UPDATE entries SET delta = :d WHERE name = 'fast-step'",
        d=delta.replace("+    return x + 2", "+    return x + 20"),
    )
    results = {r.name: r for r in seal_check(two)}
    bad = results["fast-step"]
    assert not bad.ok and "rebuilds tree" in bad.detail and bad.rebuilt is None
    # tree-verify's own delta is untouched, but its base changed under it: it fails too.
    assert not results["tree-verify"].ok
    assert [r.ok for r in seal_check(two, entries=["fast-step"])] == [False]


def test_delta_that_no_longer_applies_is_a_failure_not_a_crash(two):
    delta = two.get("tree-verify").delta
    _sql(
        two,
        "UPDATE entries SET delta = :d WHERE name = 'tree-verify'",
        d=delta.replace(" def verify(chain):", " def verify(c):"),
    )
    results = {r.name: r for r in seal_check(two)}
    assert results["fast-step"].ok
    assert not results["tree-verify"].ok and "does not apply" in results["tree-verify"].detail


def test_tampered_recorded_tree_is_caught(two):
    _sql(two, "UPDATE entries SET tree = :t WHERE name = 'tree-verify'", t="0" * 40)
    r = {r.name: r for r in seal_check(two)}["tree-verify"]
    assert not r.ok and "not its sealed tree 000000000000" in r.detail


def test_changed_stock_fails_every_entry(two, toy_stock):
    (toy_stock.path / "toy" / "__init__.py").write_text("VERSION = 99\n")
    results = seal_check(two)
    assert not any(r.ok for r in results)
    assert all("stock changed since the entry was made" in r.detail for r in results)


def test_unknown_entry_is_an_error(two):
    with pytest.raises(SpecPilotError, match="no memory entry named 'nope'"):
        seal_check(two, entries=["nope"])


def test_variant_default_drift_is_caught(memory, toy_stock):
    from specpilot.memory_store import EntryMeta

    meta = EntryMeta.model_validate(
        {"variants": [{"knob": "decode.block_size", "file": "toy.toml", "values": [4, 8], "default": 8}]}
    )
    add_entry(memory, "toy-knobs", toy_stock.path, toy_stock, meta=meta)
    _sql(memory, "UPDATE variants SET default_value = :v", v="16")
    [r] = seal_check(memory)
    assert not r.ok and "has default 16" in r.detail


def test_stacker_memo_never_hides_a_changed_delta(two, toy_stock):
    e = two.get("fast-step")
    with Stacker() as st:
        stock = st.stock_hash(toy_stock)
        good = st.build(stock, [e])
        e.delta = e.delta.replace("x + 2", "x + 5")
        assert st.build(stock, [e]) != good
