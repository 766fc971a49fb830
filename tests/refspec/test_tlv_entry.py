"""The refspec-tlv entry (stock + refspec-tree-verify + two-stage verification), checked out from the
built-in bundle: its W12 codec is SpecPilot's byte for byte; on real HumanEval prompts its output
equals greedy AR while its exact passes accept more tokens than the tree's; the Q pass and draft ②
leave the committed cache and the drafter as they were."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from .conftest import humaneval_prompts
from .test_tree_entry import ar_of, assert_lossless
from .tree_entry import checkout_entry, engine_for, import_tree

ENTRY = "refspec-tlv"
W12 = Path(__file__).resolve().parents[2] / "kernels" / "w12"
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def entry(tmp_path_factory):
    root = checkout_entry(tmp_path_factory.mktemp("tlv") / "tree", ENTRY)
    return root, import_tree(root, "refspec_tlv_entry")


@pytest.fixture(scope="module")
def tlv(entry, model):
    """A TLV engine (16 nodes) on the shared CPU model: its Q-pass copy is built once per module."""
    return engine_for(entry[1], model, tree={"nodes": 16})


def test_the_entrys_w12_codec_is_specpilots_byte_for_byte(entry):
    root, _ = entry
    for name in ("codec.py", "format.py"):
        assert (root / "refspec" / "w12" / name).read_bytes() == (W12 / name).read_bytes(), name


def test_tlv_output_is_ar_and_its_exact_passes_accept_more_than_the_tree(
    entry, model, engine, tlv, record_property
):
    _, pkg = entry
    prompts = humaneval_prompts(3)
    tree = engine_for(pkg, model, tree={"nodes": 16}, tlv={"enabled": False})
    steps = {"tree": 0, "tlv": 0}
    for n, prompt in enumerate(prompts):
        ar = ar_of(engine, prompts, n)
        out, stats = pkg.generate.greedy(tlv, prompt, NEW_TOKENS, mode="spec")
        assert_lossless(model, prompt, ar, out, f"tlv_{n}", record_property)
        steps["tlv"] += stats.steps
        steps["tree"] += pkg.generate.greedy(tree, prompt, NEW_TOKENS, mode="spec")[1].steps
    record_property("exact_passes", steps)
    assert steps["tlv"] < steps["tree"]
    policy = tlv.policy
    assert type(policy).__name__ == "TlvPolicy" and 0 < policy.q_agreed <= policy.q_checked


def test_q_pass_and_second_draft_leave_the_committed_state_as_it_was(entry, tlv):
    prompt = humaneval_prompts(1)[0]
    tlv.start(prompt, NEW_TOKENS, drafting=True)
    for _ in range(3):  # a few committed steps first: the drafter's index holds generated tokens too
        tlv.decode_step("spec", NEW_TOKENS)
    pos, kv = tlv.pos, tlv.model.kv[..., : tlv.pos, :].clone()
    context, index = list(tlv.drafter.context), {k: list(v) for k, v in tlv.drafter.index.items()}
    p = tlv.policy.propose(tlv, tlv.draft(), NEW_TOKENS)
    assert tlv.policy._chain and len(p.tokens) > len(tlv.policy._chain)  # C plus a subtree below it
    assert tlv.pos == pos and torch.equal(tlv.model.kv[..., :pos, :], kv)
    assert tlv.drafter.context == context and tlv.drafter.index == index


def test_retract_undoes_extend(entry):
    _, pkg = entry
    tlv_mod = importlib.import_module("refspec_tlv_entry.ext.tlv")
    d = pkg.drafter.NgramDrafter(4, 1)
    d.reset([1, 2, 3, 1, 2, 4, 1, 2])
    before = (list(d.context), {k: list(v) for k, v in d.index.items()})
    d.extend([3, 1, 2, 9])
    tlv_mod.retract(d, 4)
    assert (d.context, d.index) == before


def test_tlv_without_the_tree_policy_is_one_clear_error(entry, model):
    _, pkg = entry
    with pytest.raises(pkg.errors.RefspecError, match=r"set enabled = true in knobs/tree\.toml"):
        engine_for(pkg, model, tree={"enabled": False})
