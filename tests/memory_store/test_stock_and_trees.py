"""Stock lookup (built-in, materialized, plug-in for wheel stocks) and content-only tree hashes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from specpilot.deployments import Home, SpecPilotError, load_deployment
from specpilot.deployments.stock import stock_tree_path
from specpilot.memory_store import engine_stocks, stock_for
from specpilot.memory_store import stock as stock_mod
from specpilot.memory_store.gittree import source_files
from specpilot.memory_store.stacking import Stacker

from .conftest import TOY_FILES, make_tree


def test_builtin_stock_of_refspec(tmp_path):
    home = Home(tmp_path)
    s = stock_for(load_deployment("smollm-cpu"), home)
    assert (s.engine, s.path, s.label) == ("refspec", stock_tree_path("refspec"), "refspec (built-in)")
    assert engine_stocks("refspec", home) == [s]
    assert engine_stocks("nope", home) == []


def test_wheel_stock_is_refused_until_a_materializer_is_registered(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "cache"))  # materialize into this test's cache
    home = Home(tmp_path)
    dep = load_deployment("qwen27b-h100")
    monkeypatch.setattr(stock_mod, "_materializers", {})  # SGLang's own is registered by default
    with pytest.raises(SpecPilotError, match="stock wheel sglang==0.5.20 cannot be materialized yet"):
        stock_for(dep, home)

    calls = []

    def unpack(wheel: str, folder: Path) -> None:  # stands in for the real one (test_sglang_stock.py)
        calls.append(wheel)
        make_tree(folder, {"python/sglang/__init__.py": f"# {wheel}\n"})

    stock_mod.register_wheel_stock("sglang", unpack)
    s = stock_for(dep, home)
    assert s.path == home.cache / "stock" / "sglang" / "sglang-0.5.20" and s.label == "sglang==0.5.20"
    assert stock_for(dep, home) == s and calls == ["sglang==0.5.20"]  # materialized once
    assert [x.path for x in engine_stocks("sglang", home)] == [s.path]


def test_git_checkout_hashes_what_git_add_would_commit(tmp_path):
    src = make_tree(
        tmp_path / "wt", {**TOY_FILES, ".gitignore": "*.log\nout/\n", "run.log": "x", "out/a": "y"}
    )
    subprocess.run(["git", "init", "-q", str(src)], check=True)
    subprocess.run(["git", "-C", str(src), "add", "-A"], check=True)
    (src / "toy" / "untracked.py").write_text("U = 1\n")  # not yet added: still part of the tree
    files = sorted(str(p) for p in source_files(src))
    assert files == [".gitignore", "toy.toml", "toy/__init__.py", "toy/engine.py", "toy/untracked.py"]
    subprocess.run(["git", "-C", str(src), "add", "-A"], check=True)
    tree = subprocess.run(["git", "-C", str(src), "write-tree"], check=True, capture_output=True, text=True)
    with Stacker() as st:
        assert st.hash_dir(src) == tree.stdout.strip()


def test_tree_hash_ignores_modes_and_times(tmp_path):
    a = make_tree(tmp_path / "a", TOY_FILES)
    b = make_tree(tmp_path / "b", TOY_FILES)
    (b / "toy" / "engine.py").chmod(0o755)
    with Stacker() as st:
        assert st.hash_dir(a) == st.hash_dir(b)
        (b / "toy" / "engine.py").write_text("changed\n")
        assert Stacker().hash_dir(a) != Stacker().hash_dir(b)


def test_workspace_commits_exclude_caches_like_the_memory(tmp_path):
    """A worktree where the engine ran (bytecode caches) commits the same tree the memory hashes."""
    from specpilot.memory_store.workspace import Workspace

    ws, _ = Workspace.init(
        Home(tmp_path / "home"), load_deployment("smollm-cpu"), source=make_tree(tmp_path / "s", TOY_FILES)
    )
    wt = ws.add_worktree("r1")
    (wt / "toy" / "engine.py").write_text("def step(x):\n    return x\n")
    (wt / "toy" / "__pycache__").mkdir()
    (wt / "toy" / "__pycache__" / "engine.cpython-311.pyc").write_bytes(b"\0\1")
    (wt / ".pytest_cache").mkdir()
    (wt / ".pytest_cache" / "README.md").write_text("cache")
    committed = ws.commit_worktree(wt, "edit")
    with Stacker() as st:
        assert st.hash_dir(wt) == committed
