"""The refspec-w12 entry, checked out from the built-in bundle: its W12 files are SpecPilot's byte for
byte, it loads and stands aside where stock reads bf16 (the CPU path: output is stock's), and its
weights are converted only on the CUDA path's per-phase kernels (tests/gpu/test_w12_entry_gpu.py:
a pass there is stock's up to the order of its fp32 sums)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import humaneval_prompts
from .kernel_names import kernel_class, launched
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


def test_pair_blocks_put_each_programs_two_row_blocks_together(entry):
    """qkv: program (head, part) reads lo rows head·D + part·B + [0, B) and hi rows + D/2; its W12
    copy holds them at rows head·D + part·2B + [0, 2B). gate_up the same with one group."""
    import importlib

    import torch

    pairs = importlib.import_module("refspec_w12_entry.w12tiles.pairs")
    heads, d, b, k = 3, 8, 2, 5
    w = torch.arange(heads * d * k, dtype=torch.float32).reshape(heads * d, k)
    p = pairs.pair_blocks(w, heads, b)
    for head in range(heads):
        for part in range(d // 2 // b):
            lo = head * d + part * b
            at = head * d + part * 2 * b
            assert torch.equal(p[at : at + b], w[lo : lo + b])
            assert torch.equal(p[at + b : at + 2 * b], w[lo + d // 2 : lo + d // 2 + b])
    assert torch.equal(pairs.unpair_blocks(p, heads, b), w)
    g = torch.arange(12 * 2, dtype=torch.float32).reshape(12, 2)  # gate rows 0..5, up rows 6..11
    assert pairs.pair_blocks(g, 1, 3)[:, 0].tolist() == [0, 2, 4, 12, 14, 16, 6, 8, 10, 18, 20, 22]
    with pytest.raises(ValueError, match="pair blocks"):
        pairs.pair_blocks(g, 1, 4)


def test_every_kernel_the_entry_launches_has_a_profile_class(entry):
    root, _ = entry
    stock = kernel_class(root / "refspec" / "cuda_graphs.py", "CudaModel")
    model = root / "refspec" / "w12tiles" / "model.py"
    classes = kernel_class(model, "W12CudaModel", stock)
    assert launched(model) <= set(classes) and launched(model) - set(stock)  # its own kernels, named
