"""The built-in bundles SpecPilot ships (`memory_store/builtin/<engine>/`) reproduce exactly."""

from __future__ import annotations

import json

import pytest

from specpilot.deployments import Home
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
