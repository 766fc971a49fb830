"""`seal-check`: recompute every reproduction and report each one.

An entry passes when stock + its requirements + its delta rebuilds its recorded tree (and its
variant defaults match that tree); a system passes when its deployment's stock + its entry list
rebuilds its recorded tree. A failure is a result, not an exception, so one bad entry never hides
the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from specpilot.deployments import SpecPilotError, load_deployment

from .entry import Entry
from .stacking import Stacker
from .stock import StockTree
from .store import Memory
from .systems import SystemRecord, build_system
from .verify import rebuild_entry


@dataclass(frozen=True)
class SealResult:
    kind: str  # "entry" | "system"
    name: str  # entry name, or "<deployment> <tree[:12]>"
    ok: bool
    tree: str  # the recorded tree hash
    rebuilt: str | None  # the tree the rebuild produced (None when it could not finish)
    detail: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def check_entries(
    st: Stacker,
    entries: Sequence[Entry],
    known: Mapping[str, Entry],
    stocks: Mapping[str, Sequence[StockTree]],
    where: str = "the memory",
) -> list[SealResult]:
    """One result per entry; `stocks` maps each engine to its reachable stock trees."""
    out = []
    for e in entries:
        try:
            tree = rebuild_entry(st, e, known, stocks.get(e.engine, ()), where)
            detail = f"stock + {len(e.requires)} requirement(s) + delta reproduce it"
            out.append(SealResult("entry", e.name, True, e.tree, tree, detail))
        except SpecPilotError as err:
            out.append(SealResult("entry", e.name, False, e.tree, None, str(err)))
    return out


def check_systems(
    st: Stacker, memory: Memory, systems: Sequence[SystemRecord], known: Mapping[str, Entry]
) -> list[SealResult]:
    out = []
    for sysrec in systems:
        name = f"{sysrec.deployment} {sysrec.tree[:12]}"
        try:
            missing = [n for n in sysrec.entries if n not in known]
            if missing:
                raise SpecPilotError(f"its entries {missing} are not in the memory")
            dep = load_deployment(sysrec.deployment, memory.home)
            tree = build_system(st, memory.stock_for(dep), dep, [known[n] for n in sysrec.entries])
        except SpecPilotError as err:
            out.append(SealResult("system", name, False, sysrec.tree, None, str(err)))
            continue
        ok = tree == sysrec.tree
        detail = (
            f"stock + {len(sysrec.entries)} entries reproduce it"
            if ok
            else f"stock + its entries rebuild {tree[:12]}, not the sealed tree"
        )
        out.append(SealResult("system", name, ok, sysrec.tree, tree, detail))
    return out


def seal_check(
    memory: Memory, entries: Sequence[str] | None = None, systems: Sequence[SystemRecord] | None = None
) -> list[SealResult]:
    """Check the named entries and systems; with neither given, every entry and sealed system."""
    from .systems import list_systems

    known = memory.by_name()
    everything = entries is None and systems is None
    if entries is not None:
        for n in entries:
            if n not in known:
                memory.get(n)  # unknown name: one error with suggestions
    chosen = list(known.values()) if everything else [known[n] for n in entries or ()]
    sysrecs = list_systems(memory.db) if everything else list(systems or ())
    stocks = {eng: memory.stocks(eng) for eng in {e.engine for e in chosen}}
    with Stacker() as st:
        return check_entries(st, chosen, known, stocks) + check_systems(st, memory, sysrecs, known)
