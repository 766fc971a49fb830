"""The package's import graph has no cycle (typing-only imports count: a cycle there is one a
refactor turns real), and nothing imports upwards across the layers of docs/ARCHITECTURE.md."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = [
    "deployments",
    "kernels",
    "costmodel",
    "memory_store",
    "controller",
    "agents",
    "orchestrator",
    "prompts",
]
# What each package may import (docs/ARCHITECTURE.md, "Layout and layering").
ALLOWED = {
    "deployments": set(),
    "kernels": set(),
    "prompts": set(),
    "costmodel": {"deployments", "kernels"},
    "memory_store": {"deployments"},
    "controller": {"deployments", "costmodel", "memory_store"},
    "agents": {"deployments", "costmodel", "memory_store", "controller", "prompts"},
    "orchestrator": set(PACKAGES),
}


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            rel = f.relative_to(REPO)
            if rel.parts[:2] == ("deployments", "stock") and "refspec" in rel.parts:
                continue  # the stock engine tree is data, not the package
            name = "specpilot." + ".".join(rel.with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(ast.parse(f.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                base = node.module or ""
                if node.level:
                    parts = m.split(".")[: len(m.split(".")) - node.level + (1 if is_pkg else 0)]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                if t in mods and t != m and not m.startswith(t + "."):
                    edges[m].add(t)
    return edges


def test_no_import_cycles():
    edges = graph()
    faces = {m for m, f in modules().items() if f.name == "__init__.py"}  # re-exporting faces
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(edges[m] - faces):
            if state.get(t) == 1:
                cycles.append(path[path.index(t) :] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_package_imports_upwards():
    wrong = []
    for m, targets in graph().items():
        pkg = m.split(".")[1]
        for t in targets:
            other = t.split(".")[1]
            if other != pkg and other not in ALLOWED[pkg]:
                wrong.append(f"{m} imports {t}")
    assert not wrong, wrong


# Each package's public API is its `__init__` (its face); a few subpackages are faces of their own.
FACES = [f"specpilot.{p}" for p in PACKAGES] + [
    "specpilot.deployments.stock",
    "specpilot.deployments.workloads",
    "specpilot.kernels.w12",
    "specpilot.kernels.certified_head",
    "specpilot.agents.claude",
]


def public_names(face: str) -> set[str]:
    """A face's `__all__`, read from its source (nothing is imported)."""
    tree = ast.parse(modules()[face].read_text())
    for node in tree.body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) else None)
        )
        if isinstance(target, ast.Name) and target.id == "__all__" and node.value is not None:
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{face} declares no __all__")


def test_packages_use_each_other_only_through_their_public_api():
    mods = modules()
    publics = {face: public_names(face) for face in FACES}
    wrong = []
    for m, f in mods.items():
        pkg = m.split(".")[1]
        for node in ast.walk(ast.parse(f.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and not node.level
                and (node.module or "").startswith("specpilot.")
            ):
                target, names = node.module, [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                target, names = next((a.name for a in node.names if a.name.startswith("specpilot.")), ""), []
            else:
                continue
            if not target or target.split(".")[1] == pkg:
                continue
            if target not in publics:
                wrong.append(f"{m} imports {target}, which is not a package's public face")
            for name in names:
                if name not in publics.get(target, set()) and f"{target}.{name}" not in publics:
                    wrong.append(f"{m} imports {name} from {target}, which does not list it in __all__")
    assert not wrong, "\n".join(wrong)


def test_every_public_name_is_there():
    """Each name a face lists in __all__ imports (the lazy faces resolve it on first use)."""
    import importlib

    missing = [f"{face}.{name}" for face in FACES for name in sorted(public_names(face))
               if not hasattr(importlib.import_module(face), name)]  # fmt: skip
    assert not missing, missing


def test_the_cli_starts_without_torch_scipy_or_the_controller():
    """Every `specpilot` command loads the CLI; torch, scipy and the controller load only in the
    commands that judge or run a system (~5 CPU-seconds a start: the test suite starts ~100)."""
    import subprocess
    import sys

    probe = (
        "import sys, specpilot.orchestrator.cli\n"
        "print(' '.join(m for m in ('torch', 'scipy.stats', 'specpilot.controller') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "", f"the CLI loads {loaded.strip()} at start: import it inside the command"
