"""Entries: created from a tree against stock + requirements, sealed by the tree hash they reproduce."""

from __future__ import annotations

from pathlib import Path

import pytest

from specpilot.deployments import SpecPilotError
from specpilot.memory_store import EntryMeta, add_entry
from specpilot.memory_store.stacking import Stacker

from .conftest import edited

FAST = "def step(x):\n    return x + 2\n\n\ndef verify(chain):\n    return chain[:1]\n"
TREE_VERIFY = "def step(x):\n    return x + 2\n\n\ndef verify(chain):\n    return chain\n"


def test_add_stores_delta_and_reproduces_tree(memory, toy_stock, tmp_path):
    src = edited(tmp_path, toy_stock.path, "fast", {"toy/engine.py": FAST, "toy/new.py": "X = 1\n"})
    meta = EntryMeta(summary="faster step", target_factor="kernel", contracts=["lossless"])
    e = add_entry(memory, "fast-step", src, toy_stock, meta=meta)
    with Stacker() as st:
        assert e.tree == st.hash_dir(src)
        assert e.stock_tree == st.hash_dir(toy_stock.path)
        assert st.apply(e.stock_tree, e.delta, e.name) == e.tree
    assert "+    return x + 2" in e.delta and "b/toy/new.py" in e.delta
    assert (e.summary, e.target_factor, e.contracts, e.requires) == (
        "faster step",
        "kernel",
        ["lossless"],
        [],
    )
    assert memory.get("fast-step") == e


def test_requirement_delta_is_relative_to_requirements(memory, toy_stock, tmp_path):
    a = edited(tmp_path, toy_stock.path, "a", {"toy/engine.py": FAST})
    add_entry(memory, "fast-step", a, toy_stock)
    b = edited(tmp_path, a, "b", {"toy/engine.py": TREE_VERIFY})
    e = add_entry(memory, "tree-verify", b, toy_stock, requires=["fast-step"])
    # The delta only holds what b adds on top of a, and stock + a + b rebuilds b exactly.
    assert "x + 2" not in "".join(line for line in e.delta.splitlines() if line.startswith(("+", "-")))
    assert "+    return chain" in e.delta
    with Stacker() as st:
        stock = st.stock_hash(toy_stock)
        assert st.build(stock, memory.resolve(["tree-verify"])) == st.hash_dir(b) == e.tree
    assert [x.name for x in memory.resolve(["tree-verify"])] == ["fast-step", "tree-verify"]


def test_binary_and_non_utf8_files_round_trip(memory, toy_stock, tmp_path):
    blob = bytes(range(256)) * 4
    src = edited(
        tmp_path,
        toy_stock.path,
        "bin",
        {"toy/table.bin": blob, "toy/latin.txt": "caf\xe9\n".encode("latin-1")},
    )
    e = add_entry(memory, "binary-table", src, toy_stock)
    out = tmp_path / "out"
    with Stacker() as st:
        st.checkout(st.build(st.stock_hash(toy_stock), [e]), out)
    assert (out / "toy" / "table.bin").read_bytes() == blob
    assert (out / "toy" / "latin.txt").read_bytes() == b"caf\xe9\n"


def test_checkout_into_a_relative_folder(memory, toy_stock, tmp_path, monkeypatch):
    e = add_entry(memory, "rel", edited(tmp_path, toy_stock.path, "r", {"toy/new.txt": b"x\n"}), toy_stock)
    monkeypatch.chdir(tmp_path)
    with Stacker() as st:
        st.checkout(st.build(st.stock_hash(toy_stock), [e]), Path("sub") / "out")
    assert (tmp_path / "sub" / "out" / "toy" / "new.txt").read_bytes() == b"x\n"


def test_deleting_a_file_is_a_delta(memory, toy_stock, tmp_path):
    e = add_entry(
        memory, "drop-init", edited(tmp_path, toy_stock.path, "d", {"toy/__init__.py": None}), toy_stock
    )
    assert "deleted file mode 100644" in e.delta


def test_unchanged_tree_is_refused_unless_it_declares_variants(memory, toy_stock, tmp_path):
    with pytest.raises(SpecPilotError, match="does not differ from stock"):
        add_entry(memory, "nothing", toy_stock.path, toy_stock)
    meta = EntryMeta.model_validate(
        {"variants": [{"knob": "decode.block_size", "file": "toy.toml", "values": [4, 8, 16], "default": 8}]}
    )
    e = add_entry(memory, "toy-knobs", toy_stock.path, toy_stock, meta=meta)
    assert e.delta == "" and e.tree == e.stock_tree
    assert [v.as_dict() for v in e.variants] == [
        {"knob": "decode.block_size", "file": "toy.toml", "values": [4, 8, 16], "default": 8}
    ]


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        ({"knob": "decode.block_size", "file": "toy.toml", "values": [4, 8], "default": 4}, "tree sets 8"),
        ({"knob": "decode.nope", "file": "toy.toml", "values": [1], "default": 1}, "not a key of toy.toml"),
        ({"knob": "x", "file": "missing.toml", "values": [1], "default": 1}, "not in its tree"),
    ],
)
def test_variant_must_match_the_tree(memory, toy_stock, variant, message):
    meta = EntryMeta.model_validate({"variants": [variant]})
    with pytest.raises(SpecPilotError, match=message):
        add_entry(memory, "knobs", toy_stock.path, toy_stock, meta=meta)
    assert memory.entries() == []


def test_missing_requirement_is_refused(memory, toy_stock, tmp_path):
    src = edited(tmp_path, toy_stock.path, "a", {"toy/engine.py": FAST})
    with pytest.raises(SpecPilotError, match="requires 'fast-step', which is not in the memory"):
        add_entry(memory, "tree-verify", src, toy_stock, requires=["fast-step"])
    assert memory.entries() == []


def test_self_requirement_is_a_cycle(memory, toy_stock, tmp_path):
    src = edited(tmp_path, toy_stock.path, "a", {"toy/engine.py": FAST})
    with pytest.raises(SpecPilotError, match="requirement cycle loop -> loop"):
        add_entry(memory, "loop", src, toy_stock, requires=["loop"])


def test_more_than_twelve_requirements_are_refused(memory, toy_stock, tmp_path):
    names = [f"part-{i}" for i in range(13)]
    for i, n in enumerate(names):
        add_entry(memory, n, edited(tmp_path, toy_stock.path, n, {f"parts/{n}.py": f"I = {i}\n"}), toy_stock)
    everything = edited(
        tmp_path, toy_stock.path, "all", {f"parts/{n}.py": f"I = {i}\n" for i, n in enumerate(names)}
    )
    with pytest.raises(SpecPilotError, match="13 requirements; an entry may require at most 12"):
        add_entry(memory, "all-parts", everything, toy_stock, requires=names)
    # Twelve is fine: the thirteenth part becomes this entry's own delta.
    e = add_entry(memory, "all-parts", everything, toy_stock, requires=names[:12])
    assert len(e.requires) == 12 and "parts/part-12.py" in e.delta
    assert e.tree == memory.get("all-parts").tree


def test_duplicate_name_and_bad_names(memory, toy_stock, tmp_path):
    src = edited(tmp_path, toy_stock.path, "a", {"toy/engine.py": FAST})
    add_entry(memory, "fast-step", src, toy_stock)
    with pytest.raises(SpecPilotError, match="already exists"):
        add_entry(memory, "fast-step", src, toy_stock)
    for bad in ("Fast", "-x", "a_b", "x" * 65, ""):
        with pytest.raises(SpecPilotError, match="is not valid"):
            add_entry(memory, bad, src, toy_stock)
    with pytest.raises(SpecPilotError, match="more than once"):
        add_entry(memory, "twice", src, toy_stock, requires=["fast-step", "fast-step"])


def test_unknown_entry_suggests_close_names(memory, toy_stock, tmp_path):
    add_entry(memory, "fast-step", edited(tmp_path, toy_stock.path, "a", {"toy/engine.py": FAST}), toy_stock)
    with pytest.raises(SpecPilotError, match="did you mean fast-step"):
        memory.get("fast-stp")


def test_requirements_must_share_the_stock(memory, toy_stock, tmp_path):
    from specpilot.memory_store import StockTree

    add_entry(memory, "fast-step", edited(tmp_path, toy_stock.path, "a", {"toy/engine.py": FAST}), toy_stock)
    other = StockTree(
        "toy", edited(tmp_path, toy_stock.path, "stock2", {"toy/__init__.py": "VERSION = 2\n"}), "toy v2"
    )
    src = edited(tmp_path, other.path, "b", {"toy/engine.py": FAST})
    with pytest.raises(SpecPilotError, match="requirements must share engine and stock tree"):
        add_entry(memory, "on-v2", src, other, requires=["fast-step"])


def test_evidence_grows(memory, toy_stock, tmp_path):
    meta = EntryMeta(evidence=[{"deployment": "a", "gain": 1.05, "lower_bound": 1.02}])
    add_entry(
        memory,
        "fast-step",
        edited(tmp_path, toy_stock.path, "a", {"toy/engine.py": FAST}),
        toy_stock,
        meta=meta,
    )
    memory.add_evidence("fast-step", {"deployment": "b", "gain": 1.01, "run_ids": ["r1"]})
    assert [e["deployment"] for e in memory.get("fast-step").evidence] == ["a", "b"]


def test_delta_stats_count_hunk_lines_only(memory, toy_stock, tmp_path):
    # Content lines that look like diff headers ("++x" added shows as "+++x") still count.
    src = edited(
        tmp_path,
        toy_stock.path,
        "s",
        {"toy/engine.py": FAST, "notes.txt": "++x\n--y\n", "toy/__init__.py": None},
    )
    e = add_entry(memory, "stats", src, toy_stock)
    assert e.delta_stats() == {"files": 3, "added": 3, "removed": 2}


def test_entries_that_truly_conflict_are_one_line_naming_both_and_the_file(memory, toy_stock, tmp_path):
    """Two entries made against stock that change the same line: stacking them is one clear error
    naming both entries and the file, and the memory is as it was."""
    two = edited(tmp_path, toy_stock.path, "two", {"toy/engine.py": FAST.replace("chain[:1]", "chain[:2]")})
    three = edited(
        tmp_path, toy_stock.path, "three", {"toy/engine.py": FAST.replace("chain[:1]", "chain[:3]")}
    )
    a, b = (
        add_entry(memory, "verify-two", two, toy_stock),
        add_entry(memory, "verify-three", three, toy_stock),
    )
    before = memory.entries()
    with Stacker() as st:
        stock = st.stock_hash(toy_stock)
        with pytest.raises(SpecPilotError) as err:
            st.build(stock, [a, b])
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert "'verify-three' does not apply at toy/engine.py" in msg and "after 'verify-two'" in msg, msg
    assert "conflict" in msg and "require" in msg, msg  # and how to fix it
    assert memory.entries() == before
