"""Which source tree the cost model runs: a workspace revision exported by tree hash, or stock."""

from __future__ import annotations

from pathlib import Path

import pytest

from specpilot.deployments import Home, SpecPilotError, load_deployment
from specpilot.deployments.stock import stock_tree_path, tree_files
from specpilot.memory_store.workspace import Workspace
from specpilot.orchestrator.cli_costmodel import system_tree


def test_without_a_workspace_it_is_the_stock_tree(tmp_path: Path) -> None:
    home = Home.resolve(tmp_path / "home")
    tree, name = system_tree(load_deployment("smollm-cpu"), home, None)
    assert tree == stock_tree_path("refspec") and name.startswith("stock (")
    with pytest.raises(SpecPilotError, match="has no workspace"):
        system_tree(load_deployment("smollm-cpu"), home, "stock")


def test_a_workspace_revision_is_exported_by_tree_hash(tmp_path: Path) -> None:
    home = Home.resolve(tmp_path / "home")
    dep = load_deployment("smollm-cpu")
    ws, _ = Workspace.init(home, dep)
    wt = ws.add_worktree("c1")
    (wt / "refspec" / "note.py").write_text("X = 1\n")
    cand = ws.commit_worktree(wt, "a candidate")
    tree, name = system_tree(dep, home, None)
    assert name == ws.system_tree == ws.stock_tree
    assert sorted(map(str, tree_files(tree))) == sorted(map(str, tree_files(stock_tree_path("refspec"))))
    tree2, name2 = system_tree(dep, home, "cand/c1")
    assert name2 == cand and (tree2 / "refspec" / "note.py").read_text() == "X = 1\n"
    assert system_tree(dep, home, "cand/c1") == (tree2, name2)  # exported once
    with pytest.raises(SpecPilotError, match="no revision"):
        system_tree(dep, home, "nope")
