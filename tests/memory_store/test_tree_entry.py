"""The tree-verification entry ships in the built-in refspec bundle, seal-checks, declares its
variants and evidence, and carries an exact copy of the tree code in `kernels/tree.py`; the
certified-head entry carries an exact copy of `kernels/certified_head/`."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from specpilot.deployments import Home
from specpilot.deployments.stock import stock_tree_path
from specpilot.memory_store import StockTree, builtin_bundles, check_bundle, engine_stocks
from specpilot.memory_store.stacking import Stacker
from tests.refspec.tree_entry import ENTRY, bundle_entries

KERNEL = Path(__file__).resolve().parents[2] / "kernels" / "tree.py"
COPY = "refspec/tree.py"


@pytest.fixture(scope="module")
def entry():
    return bundle_entries()[ENTRY]


@pytest.fixture(scope="module")
def files(entry) -> dict[str, str]:
    """The entry tree's files that differ from stock, by path."""
    with Stacker() as st:
        stock = st.stock_hash(StockTree("refspec", stock_tree_path("refspec"), "refspec (built-in)"))
        tree = st.build(stock, [entry])
        changed = re.findall(r"^diff --git a/(\S+) b/", entry.delta, re.M)
        return {p: (st.read_file(tree, p) or b"").decode() for p in changed}


def test_entry_is_in_the_builtin_bundle_and_seal_checks(tmp_path):
    [result] = [
        r
        for r in check_bundle(builtin_bundles()["refspec"], lambda eng: engine_stocks(eng, Home(tmp_path)))
        if r.name == ENTRY
    ]
    assert result.ok, result.detail


def test_entry_metadata(entry):
    assert entry.engine == "refspec" and entry.target_factor == "tree" and entry.requires == []
    assert any(c.startswith("lossless: output equals AR on an exact pass") for c in entry.contracts)
    variants = {v.knob: v for v in entry.variants}
    assert variants["tree.enabled"].values == [False, True] and variants["tree.enabled"].default is True
    assert (
        variants["tree.nodes"].values == [8, 16, 32, 64] and variants["tree.nodes"].file == "knobs/tree.toml"
    )
    assert (
        variants["decode.block_size"].values == [8, 16]
        and variants["decode.block_size"].file == "refspec.toml"
    )
    assert all(v.default in v.values for v in entry.variants)
    assert entry.limits and entry.unverified
    kinds = {e.get("kind") for e in entry.evidence}
    assert {"replay", "paired"} <= kinds, "τ from exact replay and speed from paired controller runs"


def test_delta_adds_files_only(entry, files):
    """Composition: the entry adds its mechanism, its knobs file and the tree code; it edits no
    stock line (refspec/serve.py, the controller's measurement points, is protected anyway)."""
    assert set(files) == {"refspec/ext/tree.py", "knobs/tree.toml", COPY}
    assert "\n-" not in entry.delta.replace("\n--- ", "\n")
    knobs = tomllib.loads(files["knobs/tree.toml"])["tree"]
    assert knobs == {"enabled": True, "nodes": 8}


def definitions(source: str) -> dict[str, str]:
    """Top-level definitions (classes, functions, assignments) by name -> exact source text."""
    mod = ast.parse(source)
    lines = source.splitlines(keepends=True)
    out = {}
    for node in mod.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            name = node.name
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        else:
            continue
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        out[name] = "".join(lines[first - 1 : node.end_lineno])
    return out


def imports(source: str) -> set[str]:
    """The modules and names a source imports (`typing.Any`, `heapq`, ...)."""
    out = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            out |= {f"{'.' * n.level}{n.module}.{a.name}" for a in n.names}
    return out


def test_refspec_copy_of_the_tree_code_is_byte_identical(files):
    """One source of truth: every definition in the entry's refspec/tree.py is, byte for byte, the
    definition of that name in kernels/tree.py. When this fails, kernels/tree.py changed a
    definition the entry carries: copy it into a new entry (entries are immutable)."""
    copy, kernel = definitions(files[COPY]), definitions(KERNEL.read_text())
    assert {"ROOT", "Lattice", "Tree", "best_first_tree"} <= set(copy)
    for name, text in copy.items():
        assert name in kernel, f"{COPY} defines {name}, which kernels/tree.py does not"
        assert text == kernel[name], f"{name} in {COPY} has drifted from kernels/tree.py"
    # The copy imports nothing the kernel module does not (and so nothing of SpecPilot).
    assert imports(files[COPY]) <= imports(KERNEL.read_text())


def test_certified_head_copy_is_byte_identical():
    """The certified-head entry's refspec/certified_head/ is kernels/certified_head/, file for file.
    When this fails, the kernel package changed: copy it into a new entry (entries are immutable)."""
    entry = bundle_entries()["refspec-certified-head"]
    kernel = KERNEL.parent / "certified_head"
    with Stacker() as st:
        stock = st.stock_hash(StockTree("refspec", stock_tree_path("refspec"), "refspec (built-in)"))
        tree = st.build(stock, [entry])
        for f in sorted(kernel.glob("*.py")):
            copy = st.read_file(tree, f"refspec/certified_head/{f.name}")
            assert copy == f.read_bytes(), (
                f"refspec/certified_head/{f.name} has drifted from kernels/certified_head"
            )
