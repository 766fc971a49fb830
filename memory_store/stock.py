"""Where each engine's pristine stock tree is found.

Entries record the engine and the hash of the stock tree their deltas start from. Stock trees come
from two places:
- built in: `specpilot.deployments.stock.stock_tree_path(name)` (refspec), engine = folder name;
- materialized: `<cache>/stock/<engine>/<label>/`, where engines shipped as pinned wheels (SGLang)
  unpack their stock tree. A function registered with `register_wheel_stock` materializes a
  deployment's wheel there on first use; until one is registered, such deployments are refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.deployments.stock import STOCK_ROOT, stock_tree_path


@dataclass(frozen=True)
class StockTree:
    """One stock tree of an engine: its folder and a label for people ("refspec (built-in)")."""

    engine: str
    path: Path
    label: str


# engine -> function(wheel spec, target folder) that unpacks the stock tree into the folder.
WheelMaterializer = Callable[[str, Path], None]
_materializers: dict[str, WheelMaterializer] = {}


def register_wheel_stock(engine: str, materialize: WheelMaterializer) -> None:
    """Let deployments of `engine` whose stock is a pinned wheel materialize it on first use."""
    _materializers[engine] = materialize


def materialized_root(home: Home) -> Path:
    return home.cache / "stock"


def wheel_folder(home: Home, engine: str, wheel: str) -> Path:
    """Where a wheel's stock tree lives once unpacked (`sglang==0.5.20` -> .../sglang/sglang-0.5.20)."""
    return materialized_root(home) / engine / re.sub(r"[^A-Za-z0-9._]+", "-", wheel).strip("-")


def stock_for(dep: Deployment, home: Home) -> StockTree:
    """The deployment's stock tree, materializing a wheel's when a materializer is registered."""
    if dep.stock.tree is not None:
        return StockTree(dep.engine, stock_tree_path(dep.stock.tree), f"{dep.stock.tree} (built-in)")
    wheel = dep.stock.wheel or ""
    folder = wheel_folder(home, dep.engine, wheel)
    if not folder.is_dir():
        materialize = _materializers.get(dep.engine)
        if materialize is None:
            raise SpecPilotError(
                f"deployment {dep.name!r}: stock wheel {wheel} cannot be materialized yet "
                f"(the {dep.engine} engine is not built in this version); use a refspec deployment "
                "such as smollm-cpu"
            )
        materialize(wheel, folder)
    return StockTree(dep.engine, folder, wheel)


def engine_stocks(engine: str, home: Home) -> list[StockTree]:
    """Every stock tree of `engine` this home can reach: the built-in one, then materialized ones."""
    out = []
    if (STOCK_ROOT / engine).is_dir() and not engine.startswith(("_", ".")):
        out.append(StockTree(engine, stock_tree_path(engine), f"{engine} (built-in)"))
    root = materialized_root(home) / engine
    if root.is_dir():
        out += [StockTree(engine, p, p.name) for p in sorted(root.iterdir()) if p.is_dir()]
    return out
