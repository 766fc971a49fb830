"""Judged requests: drawn from the public pool, each under a secret tag of its own (context.py).

The prompt sets are public, so a candidate could ship stock's answers to all of them. Every judged
prompt carries 32 random bits that no one knows before the draw, and stock's greedy answer to a
tagged prompt is not its answer to the public one: answers shipped in advance are wrong tokens,
which the audit finds. Real SmolLM2 tokenizer and weights, no timing.
"""

from __future__ import annotations

import re

import torch

from specpilot.controller.context import ANCHORS, draw_requests, more_requests, pool_id
from specpilot.deployments import Home, load_deployment
from specpilot.deployments.stock import import_refspec
from specpilot.deployments.workloads import (
    judged_prompts,
    load_chat_template,
    load_requests,
    pool_file,
    target_folder,
)

TAG = re.compile(r"^(?P<pool>[a-z0-9_-]+-[^#]+)#(?P<tag>[0-9a-f]{8})$")


def _smollm(home) -> tuple[Home, object]:
    """smollm-cpu judging on the public sets (shipped, it judges on composed prompts: test_composed.py)."""
    h = Home.resolve(home)
    dep = load_deployment("smollm-cpu", h)
    return h, dep.model_copy(update={"controller": dep.controller.model_copy(update={"prompts": "public"})})


def test_each_judged_prompt_carries_a_tag_of_its_own(home):
    h, dep = _smollm(home)
    reqs, draw = draw_requests(dep, h)
    pool = {r.id: r for r in load_requests(pool_file(dep, h))}
    tokenizer = load_chat_template(target_folder(dep, h)).tokenizer
    tags = []
    for q in reqs:
        m = TAG.match(draw["sources"][q.id])
        assert m, draw["sources"][q.id]
        public = pool[m["pool"]]
        assert q.input_ids != public.input_ids and q.max_new_tokens == public.max_new_tokens
        text = tokenizer.decode(q.input_ids, skip_special_tokens=False)
        # The public prompt, word for word, with the tag's line before its turn: the same question.
        assert text.count(f"(ref {m['tag']})\n") == 1
        assert text.replace(f"(ref {m['tag']})\n", "") == tokenizer.decode(
            public.input_ids, skip_special_tokens=False
        )
        tags.append(m["tag"])
    assert len(set(tags)) == len(tags)
    # Another draw: fresh tags, none seen before (2^32 of them).
    again = draw_requests(dep, h)[1]["sources"].values()
    assert not {TAG.match(s)["tag"] for s in again} & set(tags)


def test_the_baselines_anchors_keep_their_recorded_tags(home):
    """The baseline's speed record is per tagged prompt (a prompt's speed depends on its tag), so
    the requests drawn from it come back with the same tag and the same tokens."""
    h, dep = _smollm(home)
    reqs, draw = draw_requests(dep, h, seed=1)
    by_source = {draw["sources"][q.id]: q.input_ids for q in reqs}
    record = frozenset(by_source) | {"humaneval-0", "mtbench-81"}  # a record from before tags: not anchors
    reqs2, draw2 = draw_requests(dep, h, seed=2, anchors=record)
    again = [(draw2["sources"][q.id], q.input_ids) for q in reqs2[dep.controller.warmup_requests :]]
    kept = [(s, ids) for s, ids in again if s in by_source]
    assert 1 <= len(kept) <= ANCHORS and all(ids == by_source[s] for s, ids in kept)
    assert all("#" in s for s, _ in again)


def test_an_audits_further_draws_leave_out_every_pool_prompt_used(home):
    h, dep = _smollm(home)
    used = set(draw_requests(dep, h)[1]["sources"].values())
    more = more_requests(dep, h, used)
    assert more is not None
    assert not {pool_id(s) for s in more[1]["sources"].values()} & {pool_id(s) for s in used}


def test_stock_answers_a_tagged_prompt_otherwise_than_the_public_one(home):
    """What the defense rests on: answers to the public prompts are not answers to tagged ones.
    One fixed draw of smollm-cpu's workload (its 8 prompts), 40 greedy tokens each on the real
    model: at least half the answers change (4 of 8 here; 17 of 24 at 64 tokens in
    bench/tagged_answers.py)."""
    import_refspec()
    from refspec.config import load_config
    from refspec.generate import Engine, greedy
    from refspec.model import load_model
    from refspec.weights import SMOLLM2, resolve_model

    h, dep = _smollm(home)
    reqs, draw = draw_requests(dep, h, seed=0)
    pool = {r.id: r.input_ids for r in load_requests(pool_file(dep, h))}
    config = load_config()
    torch.set_num_threads(1)
    engine = Engine(load_model(resolve_model(SMOLLM2), torch.device("cpu"), torch.float32,
                               config.runtime.cpu_layout), config)  # fmt: skip
    changed = 0
    for q in reqs:
        source = draw["sources"][q.id]
        assert judged_prompts(dep, h, [tuple(source.split("#"))]) == [q.input_ids]  # the draw renders the tag
        tagged = greedy(engine, q.input_ids, 40)[0]
        public = greedy(engine, pool[pool_id(source)], 40)[0]
        changed += tagged != public
    assert changed >= len(reqs) // 2, f"only {changed} of {len(reqs)} answers changed under their tags"
