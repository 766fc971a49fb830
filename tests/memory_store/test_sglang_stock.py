"""The SGLang stock tree from the pinned wheel, and memory entries made and seal-checked on it.

The wheel `sglang==0.5.20` is fetched with `pip download --no-deps` into the shared cache once (a
package index is needed the first time); each test then materializes into a cache of its own with
only that wheel in it, as a fresh machine with a cached wheel would, with pip's index switched off.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from sqlalchemy import text

from specpilot.controller.evaluate import protected_paths
from specpilot.controller.systems import CandidateRefused, apply_candidate, checkout
from specpilot.deployments import Home, SpecPilotError, load_deployment
from specpilot.deployments.knobs import set_knob
from specpilot.deployments.stock.wheel import LAUNCH_FILE, LAUNCH_TEMPLATE, fetch_pinned_wheel, parse_pin
from specpilot.memory_store import connect, stock_for
from specpilot.memory_store.gittree import git_run
from specpilot.memory_store.workspace import Workspace
from tests.conftest import run_cli

PIN = "sglang==0.5.20"
DEP = "qwen27b-h100"
DFLASH_UTILS = "python/sglang/srt/speculative/dflash_utils.py"


@pytest.fixture(scope="module")
def wheel() -> Path:
    """The pinned wheel in the shared cache (downloaded on the first run)."""
    return fetch_pinned_wheel(PIN, Path(os.environ["SPECPILOT_CACHE"]) / "downloads")


def fresh_cache(root: Path, wheel: Path) -> Path:
    """A cache holding only the wheel: what a machine that fetched it once has."""
    (root / "downloads").mkdir(parents=True)
    shutil.copy(wheel, root / "downloads" / wheel.name)
    return root


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip may not reach any index (a call to it would fail), for this process and the CLI's."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)


def test_stock_tree_is_the_wheels_package_byte_for_byte(tmp_path, wheel, offline, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CACHE", str(fresh_cache(tmp_path / "a", wheel)))
    stock = stock_for(load_deployment(DEP), Home(tmp_path / "home"))
    assert stock.path == tmp_path / "a" / "stock" / "sglang" / "sglang-0.5.20"
    files = {p.relative_to(stock.path).as_posix() for p in stock.path.rglob("*") if p.is_file()}
    with zipfile.ZipFile(wheel) as zf:
        members = [i for i in zf.infolist() if not i.is_dir() and ".dist-info/" not in i.filename]
        assert files == {f"python/{i.filename}" for i in members} | {LAUNCH_FILE}
        for i in members:
            assert (stock.path / "python" / i.filename).read_bytes() == zf.read(i), i.filename
    assert (stock.path / LAUNCH_FILE).read_text() == LAUNCH_TEMPLATE
    assert not list((tmp_path / "a" / "stock").glob(".materialize-*"))  # built aside, renamed in


def test_pins_and_downloads_fail_with_the_fix(tmp_path, offline):
    with pytest.raises(SpecPilotError, match="must pin exactly one version, as NAME==VERSION"):
        parse_pin("sglang>=0.5")
    with pytest.raises(
        SpecPilotError, match=r"could not download the stock wheel sglang==0\.5\.20 .*copy the wheel into"
    ):
        fetch_pinned_wheel(PIN, tmp_path / "downloads")  # no index and nothing cached
    assert [p.name for p in (tmp_path / "downloads").iterdir()] == []  # nothing half-written


def _json(*args, home: Path):
    return json.loads(run_cli("--json", *args, home=home, check=True).stdout)


def test_workspace_patch_entry_and_seal_check_on_sglang_source(tmp_path, wheel, offline, monkeypatch, home):
    monkeypatch.setenv("SPECPILOT_CACHE", str(fresh_cache(tmp_path / "cache", wheel)))
    # `workspace init` materializes the stock tree from the cached wheel, offline.
    init = _json("workspace", "init", "--deployment", DEP, home=home)
    h = Home(home)
    assert init["created"] and init["stock_tree"] == init["system_tree"]

    # A patch of the real source, as a sub-agent would write it in its worktree...
    ws = Workspace.open(h, DEP)
    wt = ws.add_worktree("d1")
    src = wt / DFLASH_UTILS
    src.write_text(src.read_text().replace(
        'DEFAULT_DFLASH_MASK_TOKEN = "<|MASK|>"\n',
        'DEFAULT_DFLASH_MASK_TOKEN = "<|MASK|>"\n# The verify window is the block: the anchor and the drafts.\n',
    ))  # fmt: skip
    set_knob(wt / LAUNCH_FILE, "server.speculative-dflash-block-size", 12)
    cand_tree = ws.commit_worktree(wt, "dflash block 12")
    # ... applied by the controller onto a clean export of stock; refused when it touches the
    # measurement points (then taken back).
    dep, repo, cache = load_deployment(DEP), ws.root / "repo", tmp_path / "systems"
    stock = checkout(repo, "stock", cache)
    assert apply_candidate(repo, stock, "cand/d1", protected_paths(dep), cache).tree == cand_tree
    (wt / "python/sglang/srt/entrypoints/http_server.py").write_text("# timing moved\n")
    ws.commit_worktree(wt, "touches the measurement points")
    with pytest.raises(
        CandidateRefused, match="protected paths: python/sglang/srt/entrypoints/http_server.py"
    ):
        apply_candidate(repo, stock, "cand/d1", protected_paths(dep), cache)
    git_run(wt, "reset", "-q", "--hard", "HEAD~1")

    # Sealed as a memory entry, with the retuned flag in its variant registry: `memory add`
    # re-applies the delta to stock and must reproduce the worktree's tree.
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"summary": "DFlash block 12", "target_factor": "tree", "variants": [
        {"knob": "server.speculative-dflash-block-size", "file": LAUNCH_FILE, "values": [8, 12, 16], "default": 12}
    ]}))  # fmt: skip
    added = _json(
        "memory", "add", "dflash-block12", "--worktree", "d1", "-d", DEP, "--meta", str(meta), home=home
    )
    assert (added["stock_tree"], added["tree"], added["files"]) == (init["stock_tree"], cand_tree, 2)

    checks = _json("seal-check", home=home)
    assert [(c["name"], c["ok"]) for c in checks] == [("dflash-block12", True)]

    # A fresh machine with only the wheel cached: seal-check materializes the stock there, finds it
    # by its content hash (the same tree as the workspace's stock commit) and passes.
    monkeypatch.setenv("SPECPILOT_CACHE", str(fresh_cache(tmp_path / "cache2", wheel)))
    assert [(c["name"], c["ok"]) for c in _json("seal-check", home=home)] == [("dflash-block12", True)]

    # A delta changed after sealing fails by name.
    db = connect(h)
    with db.session() as s:
        s.execute(text("UPDATE entries SET delta = replace(delta, 'anchor and the drafts', 'anchor') "
                       "WHERE name = 'dflash-block12'"))  # fmt: skip
    db.close()
    proc = run_cli("--json", "seal-check", home=home)
    assert proc.returncode == 1
    bad = {c["name"]: c["detail"] for c in json.loads(proc.stdout) if not c["ok"]}
    assert "rebuilds tree" in bad["dflash-block12"]
