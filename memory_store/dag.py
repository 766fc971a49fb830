"""The requirement DAG: which entries a set of entries pulls in, and in which order they apply.

The order is canonical so that a delta, made against stock + requirements in this order, always
meets the same base: a depth-first post-order that visits requirements in the order each entry
lists them. Every entry comes after all of its requirements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specpilot.deployments import SpecPilotError


def application_order(
    roots: Sequence[str], requires: Mapping[str, Sequence[str]], where: str = "the memory"
) -> list[str]:
    """`roots` and everything they require, each after its requirements.

    `requires` maps an entry name to its direct requirements. A name missing from it, or a
    cycle, is one SpecPilotError naming the chain.
    """
    order: list[str] = []
    done: set[str] = set()
    path: list[str] = []

    def visit(name: str, wanted_by: str | None) -> None:
        if name in done:
            return
        if name in path:
            cycle = path[path.index(name) :] + [name]
            raise SpecPilotError(f"requirement cycle: {' -> '.join(cycle)}")
        if name not in requires:
            who = f"entry {wanted_by!r} requires {name!r}" if wanted_by else f"entry {name!r}"
            raise SpecPilotError(f"{who}, which is not in {where}; import or add it first")
        path.append(name)
        for r in requires[name]:
            visit(r, name)
        path.pop()
        done.add(name)
        order.append(name)

    for root in roots:
        visit(root, None)
    return order


def dependents(name: str, requires: Mapping[str, Sequence[str]]) -> list[str]:
    """The entries that require `name`, directly or through others, in name order."""
    out = {n for n in requires if n != name and name in _closure(n, requires)}
    return sorted(out)


def _closure(name: str, requires: Mapping[str, Sequence[str]]) -> set[str]:
    seen: set[str] = set()
    stack = list(requires.get(name, ()))
    while stack:
        r = stack.pop()
        if r not in seen:
            seen.add(r)
            stack.extend(requires.get(r, ()))
    return seen
