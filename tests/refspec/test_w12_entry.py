"""The refspec-w12 entry, checked out from the built-in bundle: its W12 files are SpecPilot's byte for
byte, it loads and stands aside where stock reads bf16 (the CPU path: output is stock's), and its
weights are converted only on the CUDA path's per-phase kernels (tests/gpu/test_w12_entry_gpu.py:
a pass there has stock's bits)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import humaneval_prompts
from .tree_entry import checkout_entry, engine_for, import_tree

ENTRY = "refspec-w12"
W12 = Path(__file__).resolve().parents[2] / "kernels" / "w12"


@pytest.fixture(scope="module")
def entry(tmp_path_factory):
    root = checkout_entry(tmp_path_factory.mktemp("w12") / "tree", ENTRY)
    return root, import_tree(root, "refspec_w12_entry")


def test_the_entrys_w12_files_are_specpilots_byte_for_byte(entry):
    root, _ = entry
    for name in ("codec.py", "format.py", "tiles.py", "tile_kernels.py"):
        assert (root / "refspec" / "w12tiles" / name).read_bytes() == (W12 / name).read_bytes(), name


def test_knob_defaults(entry):
    _, pkg = entry
    assert pkg.config.load_config().ext["w12"] == {"enabled": True, "head": True}


def test_on_the_cpu_path_it_stands_aside_and_output_is_stock(entry, model, engine, capfd):
    _, pkg = entry
    w12 = engine_for(pkg, model)
    assert "w12: stands aside on Transformer" in capfd.readouterr().err
    assert w12.model is model
    prompt = humaneval_prompts(1)[0]
    want, _ = pkg.generate.greedy(engine_for(pkg, model, w12={"enabled": False}), prompt, 24, "spec")
    assert pkg.generate.greedy(w12, prompt, 24, "spec")[0] == want
