"""The tree-verification entry (built-in refspec bundle) is lossless: its output equals greedy AR on
real HumanEval prompts, its steps are the exact replay's, its KV compaction keeps the AR state, and
`enabled = false` is stock step for step."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from refspec.generate import greedy as stock_greedy

from specpilot.costmodel.recording import parse_record
from specpilot.costmodel.replay import replay_record
from specpilot.kernels.tree import accept_length, best_first_tree

from .conftest import humaneval_prompts, refspec_env
from .test_generate import NEAR_TIE, first_divergence_margin
from .tree_entry import checkout_entry, engine_for, import_tree

NEW_TOKENS = 48


@pytest.fixture(scope="module")
def entry_root(tmp_path_factory):
    return checkout_entry(tmp_path_factory.mktemp("entry") / "tree")


@pytest.fixture(scope="module")
def tr(entry_root):
    """The entry's refspec package (imported as `refspec_tree_entry`)."""
    return import_tree(entry_root, "refspec_tree_entry")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return humaneval_prompts(3)


_AR: dict[tuple[int, int], list[int]] = {}


def ar_of(engine, prompts, n: int, new_tokens: int = NEW_TOKENS) -> list[int]:
    """AR greedy tokens of prompt n (stock engine), computed once per module."""
    if (n, new_tokens) not in _AR:
        _AR[n, new_tokens] = stock_greedy(engine, prompts[n], new_tokens, "ar")[0]
    return _AR[n, new_tokens]


def assert_lossless(model, prompt, ar, out, what: str, record_property) -> None:
    """Equal to AR, or (as for stock) first differing only at a near tie of the fp32 logits."""
    assert len(out) == len(ar)
    if out != ar:
        j, margin = first_divergence_margin(model, prompt, ar, out)
        record_property(f"divergence_{what}", {"index": j, "margin": margin})
        assert 0 <= margin < NEAR_TIE, f"{what}: first divergence at {j} is no near tie (margin {margin:.3g})"


def test_entry_defaults_to_tree_verification(tr, model):
    config = tr.config.load_config()
    assert config.decode.mode == "spec" and config.ext["tree"] == {"enabled": True, "nodes": 8}
    eng = engine_for(tr, model)
    assert type(eng.policy).__name__ == "TreePolicy" and eng.policy.max_rows == 9


@pytest.mark.parametrize(("nodes", "block"), [(8, 8), (32, 8), (16, 16)])
def test_tree_equals_ar_on_humaneval(tr, engine, model, prompts, nodes, block, record_property):
    eng = engine_for(tr, model, {"block_size": block}, tree={"nodes": nodes})
    steps = 0
    for n, prompt in enumerate(prompts):
        out, stats = tr.generate.greedy(eng, prompt, NEW_TOKENS, "spec")
        assert_lossless(
            model, prompt, ar_of(engine, prompts, n), out, f"{nodes}n{block}b_{n}", record_property
        )
        assert stats.new_tokens == NEW_TOKENS and stats.tau == NEW_TOKENS / stats.steps
        assert stats.rows <= stats.steps * (nodes + 1)
        steps += stats.steps
    assert steps < NEW_TOKENS * len(prompts), "code prompts: the tree accepts drafts"


def test_tree_steps_are_the_exact_replay(tr, model, prompts):
    """The engine takes exactly the steps that replaying its policy on the recorded lattices
    predicts (CONTRACTS §4), so replayed τ is the engine's τ."""
    eng = engine_for(tr, model, tree={"nodes": 16})
    for prompt in prompts[2:]:
        rec = tr.record.record_request(eng, prompt, NEW_TOKENS)
        head = {
            "id": "humaneval-x",
            "prompt_len": len(prompt),
            "block_size": 8,
            "top_k": 16,
            "drafter": "ngram",
        }
        record = parse_record(json.loads(json.dumps(head | rec)), "in-process recording")
        tokens, steps = replay_record(record, lambda lat, tgt: accept_length(best_first_tree(lat, 16), tgt))
        out, stats = tr.generate.greedy(eng, prompt, NEW_TOKENS, "spec")
        assert out == rec["greedy"] and tokens == NEW_TOKENS
        assert stats.steps == steps


def test_compaction_moves_the_accepted_branch_into_place(tr, engine, model, prompts):
    """A tree whose accepted path is not nodes 0, 1, ... (decoy siblings first): the step commits
    the AR tokens, and decoding on from the compacted cache continues AR exactly."""
    prompt = prompts[0]
    ar = ar_of(engine, prompts, 0)
    eng = engine_for(tr, model, tree={"nodes": 8})
    eng.start(prompt, NEW_TOKENS, drafting=True)
    wrong = [(t + 1) % model.args.vocab for t in ar]
    tree = tr.tree.Tree()
    tree.add(wrong[0], tr.tree.ROOT, -1.0)  # node 0: a decoy at depth 1
    tree.add(ar[0], tr.tree.ROOT, -2.0)  # node 1: the right token at depth 1
    tree.add(wrong[1], 0, -3.0)  # node 2: below the decoy
    tree.add(wrong[1], 1, -3.0)  # node 3: a decoy below the right token
    tree.add(ar[1], 1, -4.0)  # node 4: the right token at depth 2
    tree.add(ar[2], 4, -5.0)  # node 5: depth 3
    pos = eng.pos
    n = len(tree) + 1
    mask = [[c == 0 or c == r for c in range(n)] for r in range(n)]
    for i, parent in enumerate(tree.parents):  # ancestors
        mask[i + 1] = [a or b for a, b in zip(mask[i + 1], mask[parent + 1], strict=True)]
    p = tr.ext.Pass([eng.last, *tree.tokens], [0, *tree.depths], mask, state=tree)
    committed = eng.step(p)
    assert committed == ar[:4] and eng.pos == pos + 4 and eng.rows == 7
    rest = []
    while len(committed) + len(rest) < NEW_TOKENS:
        rest += eng.decode_step("ar", NEW_TOKENS)  # AR steps over the compacted cache
    assert committed + rest == ar


def test_chain_knob_is_stock_step_for_step(tr, engine, model, prompts):
    """With the tree disabled the entry commits stock's chunks, step for step, row for row."""
    eng = engine_for(tr, model, tree={"enabled": False})
    assert eng.policy.max_rows == engine.config.decode.block_size + 1  # stock's chain
    for prompt in prompts[2:]:
        stock_chunks = list(engine.generate(prompt, NEW_TOKENS, "spec"))
        got_chunks = list(eng.generate(prompt, NEW_TOKENS, "spec"))
        assert got_chunks == stock_chunks
        assert (eng.stats.steps, eng.stats.rows) == (engine.stats.steps, engine.stats.rows)


def test_empty_lattice_is_an_ar_step(tr, model):
    eng = engine_for(tr, model, tree={"nodes": 8})
    prompt = list(range(100, 140))  # no repeated n-gram: nothing to draft
    out, stats = tr.generate.greedy(eng, prompt, 3, "spec")
    assert len(out) == 3 and stats.rows == stats.steps  # one row per step until a match


@pytest.mark.parametrize(
    ("line", "fix"),
    [
        ('nodes = "8"', "must be a int"),
        ("nodes = 0", "must be >= 1"),
        ("depth = 3", "unknown knob tree.depth"),
    ],
)
def test_bad_tree_knobs_are_one_clear_error(tr, tmp_path, line, fix):
    config = tr.config.load_config()
    knobs = tmp_path / "knobs"
    knobs.mkdir()
    (knobs / "tree.toml").write_text(f"[tree]\n{line}\n")
    config.ext["tree"] = tr.config.read_toml(knobs / "tree.toml")["tree"]
    with pytest.raises(tr.errors.RefspecError, match=fix):
        tr.ext.load(config, knobs)


@pytest.mark.slow
def test_entry_serves_the_protocol_with_tree_verification(entry_root, engine, prompts):
    """`python -m refspec.serve` of the entry's tree: its knobs in the ready line, AR's tokens."""
    req = {"id": "humaneval-a", "input_ids": prompts[1], "max_new_tokens": 24}
    proc = subprocess.run(
        [sys.executable, "-m", "refspec.serve", "--device", "cpu:0"],
        input=json.dumps(req) + "\n",
        capture_output=True,
        text=True,
        env=refspec_env() | {"PYTHONPATH": str(entry_root)},
        cwd=entry_root,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    ready, *steps, done = [json.loads(x) for x in proc.stdout.splitlines()]
    assert ready["ready"] and ready["knobs"]["tree"] == {"enabled": True, "nodes": 8}
    assert sum((e["tokens"] for e in steps), []) == ar_of(engine, prompts, 1, 24)
    assert done["done"] and done["stats"]["steps"] == len(steps) < 24
