"""Entries of the built-in refspec bundle (tree verification, draft confidence), built from stock.

The entry's tree is checked out from stock + its delta (the way `memory replay` builds it), and
its `refspec` package is imported under another name, so it runs in the same process as the
stock package the other refspec tests import (its modules use relative imports only).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from specpilot.deployments.stock import stock_tree_path
from specpilot.memory_store import Entry, StockTree, builtin_bundles, read_bundle
from specpilot.memory_store.stacking import Stacker
from specpilot.memory_store.verify import requirements_of

ENTRY = "refspec-tree-verify"


def bundle_entries() -> dict[str, Entry]:
    return {e.name: e for e in read_bundle(builtin_bundles()["refspec"])}


def checkout_entry(out: Path, name: str = ENTRY) -> Path:
    """Stock refspec + the entry's requirements + its delta, written to the new folder `out`."""
    known = bundle_entries()
    entry = known[name]
    with Stacker() as st:
        stock = st.stock_hash(StockTree("refspec", stock_tree_path("refspec"), "refspec (built-in)"))
        tree = st.build(stock, [*requirements_of(entry, known), entry])
        assert tree == entry.tree, "the bundle's delta no longer reproduces the entry's tree"
        st.checkout(tree, out)
    return out


def import_tree(root: Path, alias: str) -> ModuleType:
    """The `refspec` package of the tree at `root`, imported as `alias` (with its submodules)."""
    if alias in sys.modules:
        return sys.modules[alias]
    pkg = root / "refspec"
    spec = importlib.util.spec_from_file_location(
        alias, pkg / "__init__.py", submodule_search_locations=[str(pkg)]
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[alias] = mod
    spec.loader.exec_module(mod)
    for sub in ("errors", "config", "ext", "tree", "drafter", "model", "generate", "record"):
        if (pkg / f"{sub}.py").exists() or (pkg / sub).is_dir():  # `tree` exists only in its entry
            setattr(mod, sub, importlib.import_module(f"{alias}.{sub}"))
    return mod


def engine_for(pkg: ModuleType, model, decode: dict | None = None, **knobs: dict):
    """An Engine of the tree's package on a shared model: its own knob files, with `decode` knobs
    and mechanism knobs (`tree={"nodes": 16}`) overridden, its mechanisms loaded."""
    config = pkg.config.load_config()
    if decode:
        config.decode = dataclasses.replace(config.decode, **decode)
    for name, values in knobs.items():
        config.ext[name] = {**config.ext[name], **values}
    return pkg.generate.Engine(model, config, pkg.ext.load(config))


def entry_model(pkg: ModuleType, folder: Path):
    """The tree's own eager `Transformer` on CPU (batch serving checks the model's class)."""
    import torch

    config = pkg.config.load_config()
    return pkg.model.load_model(folder, torch.device("cpu"), torch.float32, config.runtime.cpu_layout)


def batch_engine(pkg: ModuleType, model, lanes: int, **knobs: dict):
    """A `BatchEngine` of the tree's package with `lanes` lanes, mechanism knobs overridden."""
    config = pkg.config.load_config()
    for name, values in knobs.items():
        config.ext[name] = {**config.ext[name], **values}
    return pkg.batch.BatchEngine(pkg.generate.Engine(model, config, pkg.ext.load(config)), lanes)
