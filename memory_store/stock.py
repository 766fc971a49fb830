"""Where each engine's pristine stock tree is found.

Entries record the engine and the hash of the stock tree their deltas start from. Stock trees come
from two places:
- built in: `specpilot.deployments.stock.stock_tree_path(name)` (refspec), engine = folder name;
- materialized: `<cache>/stock/<engine>/<label>/`, where engines shipped as pinned wheels (SGLang)
  unpack their stock tree. A function registered with `register_wheel_stock` materializes a
  deployment's wheel there on first use; SGLang's (`deployments.stock.wheel`) is registered here.
  An engine with none registered is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specpilot.deployments import Deployment, Home, SpecPilotError, deployment_files, load_deployment_file
from specpilot.deployments.stock import STOCK_ROOT, materialize_wheel_stock, stock_tree_path


@dataclass(frozen=True)
class StockTree:
    """One stock tree of an engine: its folder and a label for people ("refspec (built-in)")."""

    engine: str
    path: Path
    label: str


# engine -> function(wheel spec, target folder) that unpacks the stock tree into the folder.
WheelMaterializer = Callable[[str, Path], None]
_materializers: dict[str, WheelMaterializer] = {"sglang": materialize_wheel_stock}


def register_wheel_stock(engine: str, materialize: WheelMaterializer) -> None:
    """Let deployments of `engine` whose stock is a pinned wheel materialize it on first use."""
    _materializers[engine] = materialize


def materialized_root(home: Home) -> Path:
    return home.cache / "stock"


def wheel_folder(home: Home, engine: str, wheel: str) -> Path:
    """Where a wheel's stock tree lives once unpacked (`sglang==0.5.20` -> .../sglang/sglang-0.5.20)."""
    return materialized_root(home) / engine / re.sub(r"[^A-Za-z0-9._]+", "-", wheel).strip("-")


def _wheel_stock(engine: str, wheel: str, home: Home, who: str) -> StockTree:
    folder = wheel_folder(home, engine, wheel)
    if not folder.is_dir():
        materialize = _materializers.get(engine)
        if materialize is None:
            raise SpecPilotError(
                f"{who}: stock wheel {wheel} cannot be materialized yet (the {engine} engine is not "
                "built in this version); use a refspec deployment such as smollm-cpu"
            )
        materialize(wheel, folder)
    return StockTree(engine, folder, wheel)


def stock_for(dep: Deployment, home: Home) -> StockTree:
    """The deployment's stock tree, materializing a wheel's when a materializer is registered."""
    if dep.stock.tree is not None:
        return StockTree(dep.engine, stock_tree_path(dep.stock.tree), f"{dep.stock.tree} (built-in)")
    return _wheel_stock(dep.engine, dep.stock.wheel or "", home, f"deployment {dep.name!r}")


def _pinned_wheels(engine: str, home: Home) -> list[str]:
    """The stock wheels the deployments of this home pin for `engine` (specs that do not load are skipped)."""
    wheels = set()
    for path in deployment_files(home).values():
        try:
            dep = load_deployment_file(path)
        except SpecPilotError:
            continue  # a broken spec names no stock; `deployments show` reports it
        if dep.engine == engine and dep.stock.wheel is not None:
            wheels.add(dep.stock.wheel)
    return sorted(wheels)


def engine_stocks(engine: str, home: Home) -> list[StockTree]:
    """Every stock tree of `engine` this home can reach: the built-in one, then materialized ones.

    For an engine with a registered materializer, the wheels this home's deployments pin are
    materialized first, so seal-check and bundle import find SGLang's stock on a fresh machine.
    """
    out = []
    if (STOCK_ROOT / engine).is_dir() and not engine.startswith(("_", ".")):
        out.append(StockTree(engine, stock_tree_path(engine), f"{engine} (built-in)"))
    if engine in _materializers:
        for wheel in _pinned_wheels(engine, home):
            _wheel_stock(engine, wheel, home, f"stock of engine {engine!r}")
    root = materialized_root(home) / engine
    if root.is_dir():
        out += [StockTree(engine, p, p.name) for p in sorted(root.iterdir()) if p.is_dir()]
    return out
