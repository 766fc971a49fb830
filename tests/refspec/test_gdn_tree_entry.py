"""The refspec-gdn-tree entry (stock + refspec-tree-verify + GDN tree verification), checked out from
the built-in bundle: its refspec/gdn is SpecPilot's kernels/gdn byte for byte, and on hybrid models
the tree's output equals stock AR token for token with both methods."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from .tree_entry import checkout_entry, engine_for, import_tree

ENTRY = "refspec-gdn-tree"
KERNELS = Path(__file__).resolve().parents[2] / "kernels" / "gdn"
PROMPT = [5, 9, 17, 3, 22, 9, 17, 3, 41, 5, 9, 17, 3, 22, 9, 17, 3, 41, 5, 9] * 2


@pytest.fixture(scope="module")
def entry(tmp_path_factory):
    root = checkout_entry(tmp_path_factory.mktemp("gdn") / "tree", ENTRY)
    pkg = import_tree(root, "refspec_gdn_tree")
    return root, pkg, importlib.import_module("refspec_gdn_tree.hybrid")


def test_the_entrys_gdn_package_is_specpilots_kernels_byte_for_byte(entry):
    root, _, _ = entry
    ours = {p.name: p.read_bytes() for p in KERNELS.glob("*.py")}
    theirs = {p.name: p.read_bytes() for p in (root / "refspec" / "gdn").glob("*.py")}
    assert theirs == ours


@pytest.mark.parametrize("method", ["path", "wy"])
def test_tree_output_is_stock_ar_on_hybrid_models(entry, method):
    _, pkg, hy = entry
    args = hy.HybridArgs(vocab=64, layers=8)
    taus = {"chain": 0.0, "tree": 0.0}
    for seed in range(3):

        def model(seed=seed):
            return hy.HybridModel(args, hy.random_state(args, seed), torch.device("cpu"), torch.float32)

        stock = engine_for(pkg, model(), tree={"enabled": False}, gdn_tree={"enabled": False})
        ar, _ = pkg.generate.greedy(stock, PROMPT, 64, mode="ar")
        chain, chain_stats = pkg.generate.greedy(stock, PROMPT, 64, mode="spec")
        e = engine_for(pkg, model(), tree={"nodes": 16}, gdn_tree={"method": method})
        out, stats = pkg.generate.greedy(e, PROMPT, 64, mode="spec")
        assert chain == ar and out == ar, seed
        taus["chain"] += chain_stats.tau
        taus["tree"] += stats.tau
    assert taus["tree"] > taus["chain"]  # the trees accepted more than the chains somewhere


def test_a_bad_method_is_one_clear_error(entry):
    _, pkg, hy = entry
    args = hy.HybridArgs(vocab=64, layers=4)
    m = hy.HybridModel(args, hy.random_state(args, 0), torch.device("cpu"), torch.float32)
    with pytest.raises(pkg.errors.RefspecError, match="gdn_tree.method = 'fast'; use one of path, wy"):
        engine_for(pkg, m, gdn_tree={"method": "fast"})
