"""Bundles: export -> import -> replay gives the same trees; a corrupt bundle changes nothing."""

from __future__ import annotations

import json
import shutil

import pytest

from specpilot.deployments import Home, SpecPilotError
from specpilot.memory_store import (
    EntryMeta,
    Memory,
    add_entry,
    builtin_bundles,
    check_bundle,
    connect,
    export_bundle,
    import_bundle,
    read_bundle,
    restock_bundle,
)
from specpilot.memory_store.stacking import Stacker

from .conftest import edited
from .test_entries import FAST, TREE_VERIFY


@pytest.fixture
def stocked(memory, toy_stock, tmp_path):
    """A memory with fast-step <- tree-verify, plus toy-knobs (no code) and a binary entry."""
    a = edited(tmp_path, toy_stock.path, "a", {"toy/engine.py": FAST})
    add_entry(memory, "fast-step", a, toy_stock, meta=EntryMeta(summary="x + 2", contracts=["lossless"]))
    add_entry(
        memory,
        "tree-verify",
        edited(tmp_path, a, "b", {"toy/engine.py": TREE_VERIFY}),
        toy_stock,
        ["fast-step"],
    )
    knobs = {
        "variants": [{"knob": "drafter.max_ngram", "file": "toy.toml", "values": [2, 4, 6], "default": 4}]
    }
    add_entry(memory, "toy-knobs", toy_stock.path, toy_stock, meta=EntryMeta.model_validate(knobs))
    add_entry(
        memory, "table", edited(tmp_path, toy_stock.path, "t", {"toy/t.bin": bytes(range(256))}), toy_stock
    )
    return memory


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The four entries above, made once on SQLite and exported: a bundle to copy and damage."""
    from specpilot.memory_store import StockTree

    from .conftest import TOY_FILES, make_tree

    tmp = tmp_path_factory.mktemp("exported")
    stock = StockTree("toy", make_tree(tmp / "stock-toy", TOY_FILES), "toy (test)")
    mem = _fresh(tmp, stock, "home")
    a = edited(tmp, stock.path, "a", {"toy/engine.py": FAST})
    add_entry(mem, "fast-step", a, stock)
    add_entry(mem, "tree-verify", edited(tmp, a, "b", {"toy/engine.py": TREE_VERIFY}), stock, ["fast-step"])
    add_entry(mem, "table", edited(tmp, stock.path, "t", {"toy/t.bin": bytes(range(256))}), stock)
    export_bundle(mem, tmp / "bundle")
    mem.db.close()
    return tmp / "bundle"


@pytest.fixture
def bundle(exported, tmp_path):
    """A private copy of the exported bundle (its stock is the same content as `toy_stock`)."""
    return shutil.copytree(exported, tmp_path / "bundle")


def _fresh(tmp_path, toy_stock, name: str) -> Memory:
    h = Home(tmp_path / name)
    return Memory(connect(h, f"sqlite:///{h.root / 'specpilot.db'}"), h, stocks=[toy_stock])


def _replay_tree(memory: Memory, stock, names) -> str:
    with Stacker() as st:
        return st.build(st.stock_hash(stock), memory.resolve(names))


def test_round_trip_add_export_import_replay(stocked, toy_stock, tmp_path):
    out = tmp_path / "bundle"
    names = export_bundle(stocked, out, ["tree-verify", "table"])
    assert names == ["fast-step", "tree-verify", "table"]  # requirements first
    assert sorted(p.name for p in out.iterdir()) == [
        "bundle.json",
        "fast-step.patch",
        "table.patch",
        "tree-verify.patch",
    ]
    before = _replay_tree(stocked, toy_stock, ["tree-verify", "table"])

    other = _fresh(tmp_path, toy_stock, "other-home")  # another home (and, on PG runs, another backend)
    res = import_bundle(other, out)
    assert (res.added, res.present) == (names, [])
    assert _replay_tree(other, toy_stock, ["tree-verify", "table"]) == before
    for n in names:
        a, b = stocked.get(n), other.get(n)
        assert a.same_code(b) and a.meta() == b.meta()
    # Importing again changes nothing.
    assert import_bundle(other, out).present == names
    # And back: the stocked memory already has them all.
    assert import_bundle(stocked, out).added == []


def test_check_bundle_without_database(bundle, toy_stock):
    results = check_bundle(bundle, lambda engine: [toy_stock] if engine == "toy" else [])
    assert [(r.name, r.ok) for r in results] == [("fast-step", True), ("table", True), ("tree-verify", True)]
    assert (
        check_bundle(bundle, lambda engine: [])[0].detail
        == "no stock tree of engine 'toy' is available on this machine"
    )


def _corrupt(path, edit):
    data = json.loads((path / "bundle.json").read_text())
    edit(data)
    (path / "bundle.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: (p / "bundle.json").write_text("{nope"), "not valid JSON"),
        (lambda p: (p / "bundle.json").unlink(), "not a bundle"),
        (lambda p: (p / "fast-step.patch").unlink(), "fast-step.patch is missing"),
        (lambda p: _corrupt(p, lambda d: d["entries"][0].pop("tree")), "entries.0.tree`: missing"),
        (lambda p: _corrupt(p, lambda d: d.update(version=7)), "field `version`"),
        (lambda p: _corrupt(p, lambda d: d["entries"][0].update(extra=1)), "unknown field"),
        (lambda p: _corrupt(p, lambda d: d["entries"][0].update(tree="xyz")), "not a git tree hash"),
        (lambda p: _corrupt(p, lambda d: d["entries"][0].update(patch="../x.patch")), "must keep its delta"),
        (lambda p: _corrupt(p, lambda d: d["entries"].reverse()), "comes before its requirement"),
        (lambda p: (p / "tree-verify.patch").write_bytes(b"\xff\xfe"), "not UTF-8"),
    ],
)
def test_corrupt_bundle_is_one_error_and_imports_nothing(memory, bundle, damage, message):
    damage(bundle)
    with pytest.raises(SpecPilotError, match=message):
        import_bundle(memory, bundle)
    assert memory.entries() == []


def test_the_bundle_file_for_its_folder_names_the_folder(memory, bundle):
    with pytest.raises(SpecPilotError, match=f"a bundle is a folder .*; pass {bundle}$"):
        import_bundle(memory, bundle / "bundle.json")
    assert memory.entries() == []


def test_cycle_in_bundle_is_named(bundle):
    _corrupt(bundle, lambda d: d["entries"][0].update(requires=["tree-verify"]))
    with pytest.raises(SpecPilotError, match="requirement cycle: fast-step -> tree-verify -> fast-step"):
        read_bundle(bundle)


def test_more_than_twelve_requirements_in_bundle(bundle):
    _corrupt(bundle, lambda d: d["entries"][-1].update(requires=[f"r{i}" for i in range(13)]))
    with pytest.raises(SpecPilotError, match="at most 12"):
        read_bundle(bundle)


def test_tampered_patch_is_caught_at_import(memory, bundle):
    patch = bundle / "tree-verify.patch"
    patch.write_text(patch.read_text().replace("+    return chain\n", "+    return chain[:2]\n"))
    with pytest.raises(SpecPilotError, match="rebuilds tree .*, not its sealed tree"):
        import_bundle(memory, bundle)
    assert memory.entries() == []  # fast-step and table, which were fine, were not stored either


def test_patch_that_does_not_apply(memory, bundle):
    patch = bundle / "tree-verify.patch"
    assert "\n def verify(chain):\n" in patch.read_text()  # a context line: changing it breaks the match
    patch.write_text(patch.read_text().replace("\n def verify(chain):\n", "\n def verify(chains):\n"))
    with pytest.raises(SpecPilotError, match="the delta of entry 'tree-verify' does not apply"):
        import_bundle(memory, bundle)
    assert memory.entries() == []


def test_missing_requirement(memory, bundle):
    _corrupt(bundle, lambda d: d["entries"].pop(0))
    (bundle / "fast-step.patch").unlink()
    with pytest.raises(SpecPilotError, match="requires 'fast-step', which is not in bundle"):
        import_bundle(memory, bundle)
    assert memory.entries() == []


def test_mode_changing_patch_is_refused(memory, bundle):
    patch = bundle / "table.patch"
    patch.write_text(patch.read_text().replace("new file mode 100644", "new file mode 100755"))
    with pytest.raises(SpecPilotError, match="sets a file mode other than 100644"):
        import_bundle(memory, bundle)


def test_conflicting_entry_of_same_name(memory, bundle, toy_stock, tmp_path):
    add_entry(memory, "fast-step", edited(tmp_path, toy_stock.path, "z", {"toy/z.py": "Z = 0\n"}), toy_stock)
    with pytest.raises(SpecPilotError, match="differs from the memory's entry of that name"):
        import_bundle(memory, bundle)
    assert [e.name for e in memory.entries()] == ["fast-step"]


def test_export_refuses_to_clobber(memory, bundle, tmp_path):
    import_bundle(memory, bundle)
    out = tmp_path / "out"
    export_bundle(memory, out)
    with pytest.raises(SpecPilotError, match="--force"):
        export_bundle(memory, out)
    assert export_bundle(memory, out, ["fast-step"], force=True) == ["fast-step"]
    assert sorted(p.name for p in out.iterdir()) == ["bundle.json", "fast-step.patch"]
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.md").write_text("mine")
    with pytest.raises(SpecPilotError, match="holds other files"):
        export_bundle(memory, tmp_path / "busy", force=True)
    assert (tmp_path / "busy" / "notes.md").read_text() == "mine"


def test_builtin_mechanism_and_restock(bundle, toy_stock, tmp_path):
    """A shipped bundle is found by engine and seal-checks against its stock; after the stock
    changes it fails until a maintainer restocks it."""
    root = tmp_path / "builtin"
    root.mkdir()
    shutil.move(bundle, root / "toy")
    (root / "empty").mkdir()  # a folder without bundle.json is not a bundle
    assert builtin_bundles(root) == {"toy": root / "toy"}
    stocks = lambda engine: [toy_stock] if engine == "toy" else []  # noqa: E731
    assert all(r.ok for r in check_bundle(root / "toy", stocks))

    (toy_stock.path / "toy" / "__init__.py").write_text("VERSION = 2\n")
    failed = check_bundle(root / "toy", stocks)
    assert not any(r.ok for r in failed)
    assert "the stock changed since the entry was made" in failed[0].detail

    assert restock_bundle(root / "toy", stocks) == ["fast-step", "table", "tree-verify"]
    assert all(r.ok for r in check_bundle(root / "toy", stocks))
    with Stacker() as st:
        new_stock = st.stock_hash(toy_stock)
    assert {e.stock_tree for e in read_bundle(root / "toy")} == {new_stock}


def test_restock_refuses_a_delta_that_no_longer_applies(bundle, toy_stock):
    before = (bundle / "bundle.json").read_text()
    (toy_stock.path / "toy" / "engine.py").write_text("def step(y):\n    return y\n")
    with pytest.raises(SpecPilotError, match="does not apply"):
        restock_bundle(bundle, lambda engine: [toy_stock])
    assert (bundle / "bundle.json").read_text() == before


def _verdict(memory: Memory, approved: bool, gain: float, lower_bound: float):
    from specpilot.memory_store import records

    return records.add_verdict(
        memory.db, deployment="toy-dep", run_id=None, baseline_tree="a" * 40, candidate_tree="b" * 40,
        approved=approved, changes_output=False, gain=gain, lower_bound=lower_bound, sigma=0.01,
        threshold=0.03, unit="blocks", reasons=["lower bound -0.90% does not exceed 3.00%"], evidence={},
    )  # fmt: skip


def test_evidence_must_be_the_verdict_it_names(memory, bundle):
    """An entry whose evidence was edited after the verdict (a rejection turned into an approval,
    a gain raised) is refused at import; evidence naming a verdict held elsewhere is kept, unchecked."""
    v = _verdict(memory, approved=False, gain=1.0123, lower_bound=0.9911)
    honest = {
        "deployment": "toy-dep",
        "gain": 1.0123,
        "lower_bound": 0.9911,
        "approved": False,
        "verdict": v.id,
    }
    forged = honest | {"approved": True, "gain": 1.31}
    _corrupt(bundle, lambda d: d["entries"][0].update(evidence=[forged]))
    with pytest.raises(SpecPilotError) as err:
        import_bundle(memory, bundle)
    assert (f"entry 'fast-step', evidence item 0 (verdict {v.id[:8]}): says approved, the verdict was "
            "rejected (and 1 more)") in str(err.value)  # fmt: skip
    assert memory.entries() == []
    elsewhere = {"deployment": "toy-dep", "gain": 1.2, "verdict": "0a1b2c3d-0000-4000-8000-000000000000"}
    _corrupt(bundle, lambda d: d["entries"][0].update(evidence=[honest, elsewhere]))
    res = import_bundle(memory, bundle)
    assert res.unchecked == ["fast-step: 0a1b2c3d"]
    assert memory.get("fast-step").evidence == [honest, elsewhere]
