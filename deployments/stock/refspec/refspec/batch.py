"""Many requests per verification step (paper §2.2): refspec's batch serving.

A `BatchEngine` holds `max_batch` lanes; lane b is row b of the static KV cache and serves one
request at a time. Every step verifies one pass per busy lane in a single forward of the eager
`Transformer`: each lane's rows sit at its own RoPE positions and cache slots and attend only its
own committed slots, and a lane's pass is padded to the step's longest with rows that attend only
themselves (their K/V lands past the lane's pass, where the next step overwrites it). A request
waiting for a lane takes the first one that frees, between steps (its prompt is prefilled on its
lane alone), so the batch stays full while requests wait. Each lane drafts, verifies and accepts
as `Engine` does for one request, so every request's output is its single-request output (the
argmax of the same prefix; like spec against AR, the row count changes the GEMM, not the math).

A mechanism's batch policy (ext `batch`), when one is enabled, proposes every busy lane's pass of
a step at once (e.g. one node budget across the batch); each lane still accepts with the policy.

Lanes between busy ones that have nothing left to serve run padding rows only (the forward
covers the span of busy lanes); that is waste only while the last requests drain.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from . import ext
from .drafter import Lattice, NgramDrafter
from .errors import RefspecError
from .generate import Engine, Stats, check_prompt
from .model import Transformer, region
from .runtime import Request


class Lane:
    """One request on one cache row: the per-request state `Engine` keeps (a policy reads `last`)."""

    def __init__(self, index: int, engine: Engine):
        self.index, self.engine = index, engine
        self.model, self.config, self.device = engine.model, engine.config, engine.device
        self.drafter = NgramDrafter(self.config.drafter.max_ngram, self.config.drafter.min_ngram)
        self.request: Request | None = None
        self.mode = "spec"
        self.pos = self.last = 0
        self.stats = Stats()

    def start(self, req: Request, mode: str) -> None:
        check_prompt(req.input_ids, self.model.args.vocab)
        ids = req.input_ids
        self.model.setup_cache(self.model.batch, len(ids) + req.max_new_tokens + self.engine.policy.max_rows)
        self.model.prefill(ids[:-1], 0, lane=self.index)
        self.request, self.mode, self.stats = req, mode, Stats()
        self.pos, self.last = len(ids) - 1, ids[-1]
        if mode == "spec":
            with region("drafter"):
                self.drafter.reset(list(ids))

    @property
    def remaining(self) -> int:
        return self.request.max_new_tokens - self.stats.new_tokens

    def draft(self) -> Lattice:
        """The drafter's lattice for the committed prefix, after the mechanisms' filters."""
        d = self.config.decode
        with region("drafter"):
            lattice: Lattice = self.drafter.draft(d.block_size, d.top_k)
            for fn, knobs in self.engine.filters:
                lattice = fn(lattice, knobs)
        return lattice

    def propose(self) -> ext.Pass:
        if self.mode == "ar":
            return ext.Pass([self.last], [0])
        return self.engine.policy.propose(self, self.draft(), self.remaining)

    def accept(self, p: ext.Pass, target: list[int]) -> list[int]:
        """Commit the accepted rows and the bonus token (as `Engine.step`); the tokens to emit."""
        policy = self.engine.chain if self.mode == "ar" else self.engine.policy
        with region("other"):
            committed, path = policy.accept(self, p, target)
            if path != list(range(1, len(path) + 1)):
                self.model.move_kv(
                    [self.pos + r for r in path],
                    list(range(self.pos + 1, self.pos + 1 + len(path))),
                    self.index,
                )
        self.pos += len(path) + 1
        self.last = committed[-1]
        if self.mode == "spec":
            with region("drafter"):
                self.drafter.extend(committed)
        out = committed[: self.remaining]
        self.stats.steps += 1
        self.stats.rows += len(p.tokens)
        self.stats.new_tokens += len(out)
        return out

    @property
    def finished(self) -> bool:
        return self.stats.new_tokens >= self.request.max_new_tokens


class BatchEngine:
    """Serves requests `max_batch` at a time on one eager model (see the module's docstring)."""

    def __init__(self, engine: Engine, max_batch: int):
        if not isinstance(engine.model, Transformer):
            raise RefspecError(
                f"batch serving runs the eager Transformer, not {type(engine.model).__name__}: "
                "open the engine with open_engine(..., eager=True)"
            )
        if max_batch < 1:
            raise RefspecError(f"max_batch must be at least 1 (got {max_batch})")
        self.engine, self.model = engine, engine.model
        self.lanes = [Lane(b, engine) for b in range(max_batch)]
        self.steps = 0  # verification forwards of the latest `generate`

    def generate(self, requests: Iterable[Request], mode: str | None = None) -> Iterator[dict[str, Any]]:
        """Serve every request (greedy, exactly max_new_tokens each, EOS ignored); yield the serve
        protocol's events: {"id", "tokens"} per step of a request, {"id", "done", "stats"} at its end."""
        mode = mode or self.engine.config.decode.mode
        if mode not in ("spec", "ar"):
            raise RefspecError(f"unknown decode mode {mode!r}; use spec or ar")
        waiting = deque(requests)
        for req in waiting:  # every prompt checked before the first event
            check_prompt(req.input_ids, self.model.args.vocab)
        self.steps = 0
        self.model.setup_cache(len(self.lanes), 256)  # a cache row per lane (the engine's may have one)
        for lane in self.lanes:
            lane.request = None
        while True:
            for lane in self.lanes:
                if lane.request is None and waiting:
                    lane.start(waiting.popleft(), mode)
            busy = [lane for lane in self.lanes if lane.request is not None]
            if not busy:
                return
            passes = self.propose(busy, mode)
            targets = self.verify(passes)
            self.steps += 1
            for lane in busy:
                tokens = lane.accept(passes[lane.index], targets[lane.index])
                yield {"id": lane.request.id, "tokens": tokens}
                if lane.finished:
                    yield {"id": lane.request.id, "done": True, "stats": lane.stats.to_json()}
                    lane.request = None

    def propose(self, busy: list[Lane], mode: str) -> dict[int, ext.Pass]:
        """Each busy lane's pass: its own policy's, or a mechanism's batch policy's for all at once."""
        bp = self.engine.batch_policy
        if bp is None or mode == "ar":
            return {lane.index: lane.propose() for lane in busy}
        passes = bp.propose(busy, [lane.draft() for lane in busy], [lane.remaining for lane in busy])
        return {lane.index: p for lane, p in zip(busy, passes, strict=True)}

    def verify(self, passes: dict[int, ext.Pass]) -> dict[int, list[int]]:
        """One forward over the span of lanes in `passes`: each lane's target argmax after each row."""
        lo, hi = min(passes), max(passes) + 1
        width = hi - lo
        r = max(len(p.tokens) for p in passes.values())
        pos = [self.lanes[b].pos if b in passes else 0 for b in range(lo, hi)]
        kv_len = max(pos) + r
        self.model.setup_cache(self.model.batch, kv_len)  # a batch policy's pass may outgrow a lane's
        with region("other"):
            tokens = torch.zeros(width, r, dtype=torch.long)
            positions = torch.zeros(width, r, dtype=torch.long)
            mask = torch.zeros(width, r, kv_len, dtype=torch.bool)
            for i, b in enumerate(range(lo, hi)):
                p, start = passes.get(b), pos[i]
                n = len(p.tokens) if p is not None else 0
                positions[i] = start + torch.arange(r)
                if n:
                    tokens[i, :n] = torch.tensor(p.tokens)
                    positions[i, :n] = start + torch.tensor(p.depth)
                    mask[i, :n, :start] = True  # the lane's committed prefix
                    chain = torch.ones(n, n, dtype=torch.bool).tril()
                    mask[i, :n, start : start + n] = chain if p.mask is None else torch.tensor(p.mask)
                pad = torch.arange(n, r)
                mask[i, pad, start + pad] = True  # a padding row attends only itself
            slots = (torch.tensor(pos)[:, None] + torch.arange(r)).to(self.model.device)
            dev = self.model.device
            tokens, positions, mask = tokens.to(dev), positions.to(dev), mask.to(dev)
        head = self.engine.head
        out = self.model.forward(
            tokens, positions, slots, mask, kv_len, head=head is None, lanes=slice(lo, hi)
        )
        result = {}
        with region("lm_head" if head is not None else "other"):
            best = out.argmax(dim=-1).tolist() if head is None else None
            for i, b in enumerate(range(lo, hi)):
                if b in passes:
                    n = len(passes[b].tokens)
                    result[b] = best[i][:n] if head is None else head.argmax(out[i, :n])
        return result
