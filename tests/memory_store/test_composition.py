"""Built-in refspec entries compose: every pair in both orders, and all of them together, builds,
serves a short request with stock's output (every entry is lossless), and seal-checks.

Each mechanism adds its own files (refspec/ext/<name>.py, knobs/<name>.toml, the code it carries),
and the one that edits stock lines (prompt admission, in batch.py) edits lines no other entry
touches, so the stacks apply in any order and give the same tree.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specpilot.deployments import Home, load_deployment
from specpilot.memory_store import (
    builtin_bundles,
    import_bundle,
    open_memory,
    read_bundle,
    replay,
    seal_check,
    seal_system,
)

NAMES = sorted(e.name for e in read_bundle(builtin_bundles()["refspec"]))
# A repeating prompt so the drafter proposes and the mechanisms act; 16 new tokens.
REQUEST = {"id": "q", "input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9] * 3 + [1, 2, 3], "max_new_tokens": 16}


def serve(tree: Path) -> tuple[dict, list[int]]:
    """The ready line and the output tokens of one request through the tree's own serve process."""
    proc = subprocess.run(
        [sys.executable, "-m", "refspec.serve", "--device", "cpu:0"], input=json.dumps(REQUEST) + "\n",
        capture_output=True, text=True, cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    ready, *steps, done = [json.loads(x) for x in proc.stdout.splitlines()]
    assert done["done"]
    return ready, [t for s in steps for t in s["tokens"]]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[tuple[str, ...], tuple[str, Path]]:
    """Every ordered pair and the whole set, replayed into folders: stack -> (tree, folder)."""
    root = tmp_path_factory.mktemp("composition")
    home = Home(root / "home")
    memory = open_memory(home)
    import_bundle(memory, builtin_bundles()["refspec"])
    dep = load_deployment("smollm-cpu")
    stacks = [(), *itertools.permutations(NAMES, 2), tuple(NAMES), tuple(reversed(NAMES))]
    out = {}
    for i, stack in enumerate(stacks):
        folder = root / f"s{i}"
        r = replay(memory, dep, list(stack), folder)
        out[stack] = (r.tree, folder)
        results = seal_check(memory, systems=[seal_system(memory, dep, list(stack), r.tree)])
        assert all(x.ok for x in results), [x.detail for x in results if not x.ok]
    return out


def test_every_order_gives_the_same_tree(built):
    for a, b in itertools.combinations(NAMES, 2):
        assert built[(a, b)][0] == built[(b, a)][0], f"{a} and {b} stack differently by order"
    assert built[tuple(NAMES)][0] == built[tuple(reversed(NAMES))][0]
    stock = built[()][0]
    for stack, (tree, _) in built.items():
        with_code = [n for n in stack if n != "refspec-knobs"]  # the knob registry carries no code
        assert (tree != stock) == bool(with_code), stack


# Served: stock, every pair in one order (the other gives the same tree, asserted above) and the
# whole set in both orders; one test each, so a run on several workers spreads them.
SERVED = [*itertools.combinations(NAMES, 2), tuple(NAMES), tuple(reversed(NAMES))]


@pytest.fixture(scope="module")
def stock_output(built) -> list[int]:
    return serve(built[()][1])[1]


@pytest.mark.slow
@pytest.mark.parametrize(
    "stack", SERVED, ids=[f"{len(s)}:{'+'.join(n.removeprefix('refspec-') for n in s)}" for s in SERVED]
)
def test_every_stack_serves_stock_output(built, stock_output, stack):
    ready, out = serve(built[stack][1])
    assert out == stock_output, f"{'+'.join(stack)} changed the output"
    for name in stack:
        mech = {"refspec-tree-verify": "tree", "refspec-draft-confidence": "draft_confidence",
                "refspec-certified-head": "certified_head"}.get(name)  # fmt: skip
        if mech:
            assert ready["knobs"][mech]["enabled"] is True, f"{name}'s knobs are not in force"
