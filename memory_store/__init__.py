"""The memory store (ARCHITECTURE §8, paper §3.5): verified mechanisms as entries that reproduce
the exact code, systems sealed by tree hash, bundles, and the database every package records in.

Imports only `specpilot.deployments`.
"""

from specpilot.deployments import Home

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
from .store import Memory
from .systems import Replay, SystemRecord, find_systems, list_systems, replay, seal_system


def open_memory(home: Home, url: str | None = None) -> Memory:
    """The memory of `home` (its database at `url`, default the home's)."""
    return Memory(connect(home, url), home)


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
