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
}
__all__ = [
    "Database",
    "Entry",
    "EntryMeta",
    "ImportResult",
    "Memory",
    "Replay",
    "SealResult",
    "StockTree",
    "SystemRecord",
    "Variant",
    "add_entry",
    "builtin_bundles",
    "check_bundle",
    "connect",
    "engine_stocks",
    "export_bundle",
    "find_systems",
    "import_bundle",
    "list_systems",
    "open_memory",
    "read_bundle",
    "records",
    "register_wheel_stock",
    "replay",
    "restock_bundle",
    "seal_check",
    "seal_system",
    "stock_for",
    "write_bundle",
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
    from .entry import Entry, EntryMeta, Variant
    from .sealcheck import SealResult, seal_check
    from .stock import StockTree, engine_stocks, register_wheel_stock, stock_for
    from .store import Memory, open_memory
    from .systems import Replay, SystemRecord, find_systems, list_systems, replay, seal_system
