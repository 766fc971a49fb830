"""Composed prompts (controller/composed.py): the pool the controller samples from stock at Phase 0
under a secret seed, judged where no operator set is registered, so no answer shipped ahead of time
matches a judged prompt.

Real SmolLM2 weights, tokenizer and chat template, a real SQLite home; no timing.
"""

from __future__ import annotations

import re

import pytest

from specpilot import controller
from specpilot.controller import composed
from specpilot.controller.context import draw_requests, more_requests
from specpilot.deployments import Deployment, Home, SpecPilotError, load_deployment
from specpilot.deployments.workloads import VARIANT, load_chat_template, load_prompts, target_folder
from specpilot.memory_store import connect, records

SOURCE = re.compile(r"^comp-(?P<set>humaneval|mtbench)-(?P<n>\d+)#(?P<tag>[0-9a-f]{8})$")


def _small(home) -> tuple[Home, Deployment]:
    """smollm-cpu as shipped (composed prompts), one prompt of each set per draw, audits of 256
    positions: a pool of 4 draws (2 for the comparison and its audit, 2 spare)."""
    h = Home.resolve(home)
    dep = load_deployment("smollm-cpu", h)
    assert dep.controller.prompts == "composed"
    return h, dep.model_copy(update={
        "workload": dep.workload.model_copy(update={"sets": {"humaneval": 1, "mtbench": 1}}),
        "controller": dep.controller.model_copy(update={"audit_positions": 256})})  # fmt: skip


def test_a_composed_pool_is_new_text_and_secret_to_its_seed(home):
    h, dep = _small(home)
    tok = load_chat_template(target_folder(dep, h)).tokenizer
    pool = composed.compose(dep, h, seed=1)
    assert [p.id for p in pool] == [
        f"comp-humaneval-{i}" for i in range(composed.pool_size(dep, "humaneval"))
    ] + [f"comp-mtbench-{i}" for i in range(composed.pool_size(dep, "mtbench"))]
    assert composed.draws(dep) == 4 and composed.pool_size(dep, "humaneval") == 4 * (1 + 1)
    assert len({p.turns[0] for p in pool}) == len(pool), "a pool holds no text twice"
    n = composed.NOVEL_NGRAM
    for name in ("humaneval", "mtbench"):
        public = [p.turns[0] for p in load_prompts(name, h)]
        runs = {tuple(ids[i : i + n]) for t in public for ids in [tok.encode(t, add_special_tokens=False).ids]
                for i in range(len(ids) - n + 1)}  # fmt: skip
        for p in (p for p in pool if p.set == name):
            text = p.turns[0]
            # It opens as a public prompt does (a code prompt: up to its `def`) and goes on with new text.
            head = max(
                (o for t in public if text.startswith(o := composed.opening(t) or t[:8])), key=len, default=""
            )
            assert head, text[:80]
            new = tok.encode(text[len(head) :], add_special_tokens=False).ids
            assert len(new) >= composed.MIN_SAMPLED
            assert not any(tuple(new[i : i + n]) in runs for i in range(len(new) - n + 1)), text
            assert "<|im_end|>" not in text and "<|im_start|>" not in text
            if name == "humaneval":  # a stub: a sampled signature and its docstring, the fence closed
                assert re.fullmatch(r' [^\n]*\([^\n]*:\n    """.*\n    """\n```', text[len(head) :], re.S), (
                    text
                )
    # Another seed, another pool: no text of one is in the other.
    assert not {p.turns[0] for p in pool} & {p.turns[0] for p in composed.compose(dep, h, seed=2)}


def test_openings_of_any_lengths_sample_in_one_batch_as_each_would_alone(home):
    """The pads that put openings of several lengths in one batch are masked out: each row's next-
    token logits, at the prompt and after a sampled token, are those of the opening run alone."""
    import torch

    from specpilot.controller.scorer import _stock_model

    h, dep = _small(home)
    tok = load_chat_template(target_folder(dep, h)).tokenizer
    model = _stock_model(dep.target.model, str(h.cache), "cpu")
    texts = ["def add(a, b):\n    return", "Write a haiku about", "x"]
    openings = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    assert len({len(o) for o in openings}) == 3
    batch, real = composed._prefill(model, openings, steps=2)
    nxt = batch[:, -1].argmax(-1, keepdim=True)
    after = composed._decode(model, nxt, max(map(len, openings)), real)
    for i, ids in enumerate(openings):
        alone, one = composed._prefill(model, [ids], steps=2)
        assert torch.allclose(batch[i, -1], alone[0, -1], atol=1e-4), texts[i]
        again = composed._decode(model, nxt[i : i + 1], len(ids), one)
        assert torch.allclose(after[i, -1], again[0, -1], atol=1e-4), texts[i]


def test_finished_rows_leave_the_batch_and_the_rest_sample_as_beside_them(home, monkeypatch):
    """A row finished by `done` stops where it held, its cache row leaves the batch, and the rows
    left go on exactly as they would have beside it (sampling made argmax, so runs compare)."""
    import torch

    from specpilot.controller.scorer import _stock_model

    h, dep = _small(home)
    tok = load_chat_template(target_folder(dep, h)).tokenizer
    model = _stock_model(dep.target.model, str(h.cache), "cpu")
    texts = ["def add(a, b):\n    return", "Write a haiku about", "x", "The capital of France is"]
    openings = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    monkeypatch.setattr(composed, "TEMPERATURE", 1e-6)
    full = composed._sample(model, openings, 12, set(), torch.Generator().manual_seed(0))
    assert all(len(r) == 12 for r in full)
    ends = {0: 2, 2: 3, 3: 5}  # row -> the token it finishes on
    stops = {tuple(full[r][:k]) for r, k in ends.items()}
    for r, row in enumerate(full):  # each row meets a stop only where it is meant to finish
        hits = [k for k in range(1, 13) if tuple(row[:k]) in stops]
        assert hits == ([ends[r]] if r in ends else []), (r, hits)
    rows_decoded = []
    decode = composed._decode
    monkeypatch.setattr(
        composed,
        "_decode",
        lambda m, nxt, at, real: rows_decoded.append(len(nxt)) or decode(m, nxt, at, real),
    )
    early = composed._sample(
        model, openings, 12, set(), torch.Generator().manual_seed(0), lambda row: tuple(row) in stops
    )
    assert early == [full[0][:2], full[1], full[2][:3], full[3][:5]]
    assert rows_decoded[0] == 4 and rows_decoded[-1] == 1, rows_decoded


def test_draws_come_from_phase0s_pool_and_an_operators_set_comes_first(home, tmp_path):
    h, dep = _small(home)
    with pytest.raises(
        SpecPilotError, match=re.escape("none are composed yet: run `specpilot phase0 -d smollm-cpu`")
    ):
        draw_requests(dep, h)
    records.set_state(connect(h), dep.name, "speeds", {"stock:sliced": {"comp-humaneval-0#00000000": 1.0}})
    assert composed.make(dep, h) == {"humaneval": 8, "mtbench": 8}
    # The baselines' speed records name pool ids, which the new pool gives to other prompts.
    assert records.get_state(connect(h), dep.name, "speeds") is None
    texts = {p.id: p.turns[0] for p in composed.load(dep, h)}
    template = load_chat_template(target_folder(dep, h))
    reqs, draw = draw_requests(dep, h)
    assert draw["composed"] is True and draw["held_out"] is False and draw["pool"] == 16
    for q in reqs:
        m = SOURCE.match(draw["sources"][q.id])
        assert m, draw["sources"][q.id]
        turn = texts[draw["sources"][q.id].split("#")[0]]
        assert q.input_ids == template.encode(
            VARIANT.format(tag=m["tag"], turn=turn), dep.workload.system_prompt, False
        )
    # An audit's further draws: composed prompts the first did not use.
    _, extra = more_requests(dep, h, set(draw["sources"].values()))
    used = {s.split("#")[0] for s in draw["sources"].values()}
    assert extra["composed"] and not {s.split("#")[0] for s in extra["sources"].values()} & used
    # Each Phase 0 composes afresh: the next pool shares no prompt with this one.
    composed.make(dep, h)
    assert not set(texts.values()) & {p.turns[0] for p in composed.load(dep, h)}
    # An operator's held-out prompts are judged in its place.
    rows = [
        {"set": s, "prompt": f"Write test {i} of {s}."} for s in ("humaneval", "mtbench") for i in range(3)
    ]
    (tmp_path / "mine.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    controller.held_out.store(dep, h, tmp_path / "mine.jsonl")
    draw = draw_requests(dep, h)[1]
    assert draw["held_out"] is True and draw["composed"] is False


def test_only_refspec_deployments_compose(home):
    h = Home.resolve(home)
    dep = load_deployment("qwen27b-h100", h)
    spec = dep.model_dump() | {"controller": dep.controller.model_dump() | {"prompts": "composed"}}
    with pytest.raises(ValueError, match="controller.prompts 'composed' samples refspec's stock model"):
        Deployment.model_validate(spec)
