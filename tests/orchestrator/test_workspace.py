from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from specpilot.deployments import Home, SpecPilotError, load_deployment
from specpilot.memory_store.gittree import write_tree
from specpilot.memory_store.workspace import Workspace


def _tree(root: Path) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (root / "pkg" / "sub" / "mod.py").write_text("def f():\n    return 2\n")
    (root / "knobs.toml").write_text("block_size = 8\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\x00junk")
    return root


@pytest.fixture
def dep():
    return load_deployment("smollm-cpu")


def test_init_is_idempotent_and_hash_is_stable(tmp_path, dep):
    src = _tree(tmp_path / "src")
    home = Home(tmp_path / "home")
    ws, created = Workspace.init(home, dep, source=src)
    again, created_again = Workspace.init(home, dep, source=src)
    assert (created, created_again) == (True, False)
    assert ws.stock_tree == again.stock_tree == ws.system_tree
    # Another home, other mtimes and modes: same tree hash.
    other = tmp_path / "src2"
    shutil.copytree(src, other)
    os.utime(other / "knobs.toml", (1, 1))
    (other / "pkg" / "__init__.py").chmod(0o755)
    ws2, _ = Workspace.init(Home(tmp_path / "home2"), dep, source=other)
    assert ws2.stock_tree == ws.stock_tree
    # The same commit too (fixed identity and dates).
    assert ws2.commit("stock") == ws.commit("stock")


def test_tree_hash_equals_plain_git_and_ignores_caches(tmp_path):
    src = _tree(tmp_path / "src")
    plain = tmp_path / "plain"
    shutil.copytree(src, plain, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q", str(plain)], check=True)
    subprocess.run(["git", "-C", str(plain), "add", "-A"], check=True)
    expected = subprocess.run(
        ["git", "-C", str(plain), "write-tree"], check=True, capture_output=True, text=True
    )
    assert write_tree(plain, src) == expected.stdout.strip()


def test_changed_stock_is_refused_and_workspace_kept(tmp_path, dep):
    src = _tree(tmp_path / "src")
    home = Home(tmp_path / "home")
    ws, _ = Workspace.init(home, dep, source=src)
    before = ws.stock_tree
    (src / "knobs.toml").write_text("block_size = 16\n")
    with pytest.raises(SpecPilotError, match="stock tree is now"):
        Workspace.init(home, dep, source=src)
    assert Workspace.open(home, dep.name).stock_tree == before


def test_candidate_worktree_commit_and_promotion(tmp_path, dep):
    ws, _ = Workspace.init(Home(tmp_path / "home"), dep, source=_tree(tmp_path / "src"))
    wt = ws.add_worktree("r1-d1")
    (wt / "knobs.toml").write_text("block_size = 16\n")
    (wt / "pkg" / "new.py").write_text("X = 3\n")
    cand_tree = ws.commit_worktree(wt, "retune block size")
    assert cand_tree not in (ws.stock_tree, ws.system_tree)
    assert wt in ws.worktrees()
    assert ws.set_system("cand/r1-d1") == cand_tree
    assert ws.system_tree == cand_tree
    assert (ws.root / "repo" / "pkg" / "new.py").read_text() == "X = 3\n"
    ws.remove_worktree("r1-d1")
    assert ws.worktrees() == []


def test_open_missing_workspace_names_the_fix(tmp_path):
    with pytest.raises(SpecPilotError, match="specpilot workspace init --deployment smollm-cpu"):
        Workspace.open(Home(tmp_path), "smollm-cpu")


def test_refspec_stock_tree_hash_is_reproducible(tmp_path, dep):
    a, _ = Workspace.init(Home(tmp_path / "a"), dep)
    b, _ = Workspace.init(Home(tmp_path / "b"), dep)
    assert a.stock_tree == b.stock_tree
    files = a.git("ls-tree", "-r", "--name-only", "stock").splitlines()
    assert any(f.startswith("refspec/") for f in files)
    assert not any("__pycache__" in f for f in files)
