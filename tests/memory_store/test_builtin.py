"""The built-in bundles SpecPilot ships (`memory_store/builtin/<engine>/`) reproduce exactly."""

from __future__ import annotations

import json

import pytest

from specpilot.deployments import Home
from specpilot.deployments.stock import stock_tree_path
from specpilot.memory_store import builtin_bundles, check_bundle, engine_stocks
from tests.conftest import run_cli

SHIPPED = builtin_bundles()
ENGINES = sorted(SHIPPED) or [pytest.param(None, marks=pytest.mark.skip(reason="no built-in bundle shipped"))]


@pytest.mark.parametrize("engine", ENGINES)
def test_builtin_bundle_seal_checks(engine, tmp_path):
    results = check_bundle(SHIPPED[engine], lambda eng: engine_stocks(eng, Home(tmp_path)))
    assert results, f"built-in bundle {engine} is empty"
    bad = [(r.name, r.detail) for r in results if not r.ok]
    assert not bad, (
        f"built-in bundle {engine} no longer reproduces (after a stock change run `specpilot memory restock {SHIPPED[engine]}`): {bad}"
    )


def test_seal_check_builtin_on_the_command_line(home):
    proc = run_cli("--json", "seal-check", "--builtin", home=home)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(json.loads(proc.stdout)) == sum(
        len(json.loads((p / "bundle.json").read_text())["entries"]) for p in SHIPPED.values()
    )
    assert not home.exists()  # checking a bundle needs no database


def test_refspec_ships_its_knob_registry():
    assert "refspec" in SHIPPED
    from specpilot.memory_store import read_bundle

    [knobs] = [e for e in read_bundle(SHIPPED["refspec"]) if e.name == "refspec-knobs"]
    assert knobs.delta == "" and knobs.tree == knobs.stock_tree
    assert {v.knob for v in knobs.variants} >= {"decode.block_size", "drafter.max_ngram"}
    assert all(v.file == "refspec.toml" and v.default in v.values for v in knobs.variants)


def test_import_builtin_refspec_and_replay(backend, home, tmp_path):
    rows = json.loads(
        run_cli("--json", "memory", "import", "--builtin", "refspec", home=home, check=True).stdout
    )
    assert "refspec-knobs" in rows["added"]
    again = json.loads(
        run_cli("--json", "memory", "import", "--builtin", "refspec", home=home, check=True).stdout
    )
    assert again["added"] == [] and "refspec-knobs" in again["present"]
    out = tmp_path / "system"
    rep = json.loads(
        run_cli("--json", "memory", "replay", "-d", "smollm-cpu", "--entries", "refspec-knobs", "--out", str(out),
                home=home, check=True).stdout
    )  # fmt: skip
    assert rep["tree"] == rep["stock_tree"]  # a knob registry changes no code
    assert (out / "refspec.toml").read_text() == (stock_tree_path("refspec") / "refspec.toml").read_text()
