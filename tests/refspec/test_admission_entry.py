"""The prompt-admission entry (built-in refspec bundle): in batch serving a new request's prompt
rides in the running requests' verification steps, a chunk a step, instead of a prefill of its own;
every output stays its single-request AR output."""

from __future__ import annotations

import importlib

import pytest
from refspec.generate import greedy as stock_greedy

from .conftest import humaneval_prompts
from .tree_entry import batch_engine, checkout_entry, entry_model, import_tree

ENTRY = "refspec-prompt-admission"


@pytest.fixture(scope="module")
def pa(tmp_path_factory):
    """The entry's refspec package (imported as `refspec_prompt_admission`)."""
    tree = checkout_entry(tmp_path_factory.mktemp("pa") / "tree", ENTRY)
    pkg = import_tree(tree, "refspec_prompt_admission")
    for sub in ("runtime", "batch"):
        setattr(pkg, sub, importlib.import_module(f"refspec_prompt_admission.{sub}"))
    return pkg


@pytest.fixture(scope="module")
def pa_model(pa, folder):
    return entry_model(pa, folder)


def requests(pa, prompts, new_tokens):
    return [
        pa.runtime.Request(id=i, input_ids=p, max_new_tokens=n)
        for i, (p, n) in enumerate(zip(prompts, new_tokens, strict=True))
    ]


def test_knobs(pa, pa_model):
    assert pa.config.load_config().ext["admission"] == {"enabled": True, "min_rows": 16}
    assert batch_engine(pa, pa_model, 2, admission={"enabled": False}).admission is None
    with pytest.raises(pa.errors.RefspecError, match="admission.min_rows must be at least 1"):
        batch_engine(pa, pa_model, 2, admission={"min_rows": 0})


def test_chunks_follow_the_step(pa, pa_model):
    """An admitted lane holds no prompt K/V yet; its chunk is the step's widest pass (at least
    min_rows), or the shortest remaining prompt when no lane decodes."""
    be = batch_engine(pa, pa_model, 3, admission={"min_rows": 4})
    long, short = list(range(10, 110)), list(range(10, 40))
    be.model.setup_cache(3, 256)
    for lane, p in zip(be.lanes[:2], (long, short), strict=True):
        lane.start(pa.runtime.Request(id=lane.index, input_ids=p, max_new_tokens=4), "spec", admit=True)
    assert [(lane.pos, lane.unfilled) for lane in be.lanes[:2]] == [(0, 99), (0, 29)]
    first = be.admit(be.lanes[:2], {})
    assert {b: len(p.tokens) for b, p in first.items()} == {0: 29, 1: 29}
    assert first[0].tokens == long[:29] and first[0].depth == list(range(29)) and first[0].mask is None
    be.lanes[0].pos = 29
    wide = pa.ext.Pass(list(range(9)), list(range(9)))
    assert be.admit(be.lanes[:1], {2: wide})[0].tokens == long[29:38]  # as wide as the step
    assert len(be.admit(be.lanes[:1], {2: pa.ext.Pass([1, 2], [0, 1])})[0].tokens) == 4  # min_rows
    be.lanes[0].pos = 96
    assert be.admit(be.lanes[:1], {2: wide})[0].tokens == long[96:99]  # the prompt's last rows


@pytest.mark.parametrize("mode", ["spec", "ar"])
def test_batch_outputs_equal_single_request_ar(pa, engine, pa_model, mode):
    """Two lanes, five requests of different prompt and output lengths (three admitted while the
    others decode): each output is its single-request AR output."""
    prompts, n = humaneval_prompts(5), [24, 16, 32, 8, 20]
    prompts[3] = prompts[3][:1]  # a one-token prompt has nothing to admit
    be = batch_engine(pa, pa_model, 2)
    out: dict[int, list[int]] = {i: [] for i in range(5)}
    for ev in be.generate(requests(pa, prompts, n), mode):
        if "tokens" in ev:
            out[ev["id"]].extend(ev["tokens"])
    for i, p in enumerate(prompts):
        assert out[i] == stock_greedy(engine, p, n[i], "ar")[0], f"request {i} changed"
