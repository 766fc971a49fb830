"""The memory store (ARCHITECTURE §8, paper §3.5): verified mechanisms as entries that reproduce
the exact code, systems sealed by tree hash, bundles, and the database every package records in.

Imports only `specpilot.deployments`. The public names below load their module on first use, so
importing a light part (`gittree`, used by every workspace command) does not pull in SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "records": "records",
    "add_entry": "authoring",
    "ImportResult": "bundles",
    "builtin_bundles": "bundles",
    "check_bundle": "bundles",
    "export_bundle": "bundles",
    "import_bundle": "bundles",
    "read_bundle": "bundles",
    "restock_bundle": "bundles",
    "write_bundle": "bundles",
    "Database": "db",
    "connect": "db",
    "Entry": "entry",
    "EntryMeta": "entry",
    "Variant": "entry",
    "SealResult": "sealcheck",
    "seal_check": "sealcheck",
    "StockTree": "stock",
    "engine_stocks": "stock",
    "register_wheel_stock": "stock",
    "stock_for": "stock",
    "Memory": "store",
    "open_memory": "store",
    "Replay": "systems",
    "SystemRecord": "systems",
    "find_systems": "systems",
    "list_systems": "systems",
    "replay": "systems",
    "seal_system": "systems",
    "CACHE_EXCLUDES": "gittree",
    "GitError": "gittree",
    "git_bytes": "gittree",
    "git_run": "gittree",
    "git_try": "gittree",
    "safe_extract": "gittree",
    "write_tree": "gittree",
    "describe": "entry",
    "VerdictRecord": "records",
    "STOCK_TAG": "workspace",
    "SYSTEM_BRANCH": "workspace",
    "Workspace": "workspace",
    "stock_source": "workspace",
}
__all__ = [
    "CACHE_EXCLUDES",
    "STOCK_TAG",
    "SYSTEM_BRANCH",
    "Database",
    "Entry",
    "EntryMeta",
    "GitError",
    "ImportResult",
    "Memory",
    "Replay",
    "SealResult",
    "StockTree",
    "SystemRecord",
    "Variant",
    "VerdictRecord",
    "Workspace",
    "add_entry",
    "builtin_bundles",
    "check_bundle",
    "connect",
    "describe",
    "engine_stocks",
    "export_bundle",
    "find_systems",
    "git_bytes",
    "git_run",
    "git_try",
    "import_bundle",
    "list_systems",
    "open_memory",
    "read_bundle",
    "records",
    "register_wheel_stock",
    "replay",
    "restock_bundle",
    "safe_extract",
    "seal_check",
    "seal_system",
    "stock_for",
    "stock_source",
    "write_bundle",
    "write_tree",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    mod = importlib.import_module(f"{__name__}.{module}")
    return mod if name == module else getattr(mod, name)


if TYPE_CHECKING:
    from . import records
    from .authoring import add_entry
    from .bundles import (
        ImportResult,
        builtin_bundles,
        check_bundle,
        export_bundle,
        import_bundle,
        read_bundle,
        restock_bundle,
        write_bundle,
    )
    from .db import Database, connect
    from .entry import Entry, EntryMeta, Variant, describe
    from .gittree import CACHE_EXCLUDES, GitError, git_bytes, git_run, git_try, safe_extract, write_tree
    from .records import VerdictRecord
    from .sealcheck import SealResult, seal_check
    from .stock import StockTree, engine_stocks, register_wheel_stock, stock_for
    from .store import Memory, open_memory
    from .systems import Replay, SystemRecord, find_systems, list_systems, replay, seal_system
    from .workspace import STOCK_TAG, SYSTEM_BRANCH, Workspace, stock_source
