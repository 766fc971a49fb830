"""The stock trees of built-in engines, shipped as package data (ARCHITECTURE §10).

A stock tree is copied into each workspace as its `stock` commit; it is never imported from
site-packages. In-process users of refspec (tokenizer, weights) go through `import_refspec`,
which puts the pristine stock tree on sys.path.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from ..errors import SpecPilotError

STOCK_ROOT = Path(__file__).resolve().parent
IGNORED_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".DS_Store"}


def stock_tree_path(name: str) -> Path:
    """The folder of a built-in stock tree (e.g. 'refspec')."""
    path = STOCK_ROOT / name
    if not path.is_dir() or name.startswith(("_", ".")):
        known = ", ".join(p.name for p in STOCK_ROOT.iterdir() if p.is_dir() and not p.name.startswith("_"))
        raise SpecPilotError(f"unknown built-in stock tree {name!r}; known: {known}")
    return path


def tree_files(root: Path) -> Iterator[Path]:
    """The files of a source tree, relative to it, in a stable order, without caches."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not IGNORED_PARTS.intersection(rel.parts) and path.suffix != ".pyc":
            yield rel


def import_refspec() -> ModuleType:
    """The `refspec` package of the pristine stock tree, imported in this process."""
    root = str(stock_tree_path("refspec"))
    if root not in sys.path:
        sys.path.insert(0, root)
    module = importlib.import_module("refspec")
    if Path(module.__file__).resolve().parent.parent != Path(root):
        raise SpecPilotError(
            f"`refspec` is already imported from {module.__file__}, not from the stock tree {root}"
        )
    return module


from .wheel import LAUNCH_FILE, materialize_wheel_stock  # noqa: E402 — wheel imports nothing of this file

__all__ = ["IGNORED_PARTS", "LAUNCH_FILE", "STOCK_ROOT", "import_refspec", "materialize_wheel_stock",
           "stock_tree_path", "tree_files"]  # fmt: skip
