"""Prefill, greedy AR and stock speculative decoding over one request at a time.

Every decode step is one verification pass: its rows are the last committed token (whose K/V is
not in the cache yet) followed by the draft, at cache slots pos, pos+1, ...; row r predicts the
token after row r. AR is the same step with no draft. Stock speculative decoding drafts m
positions with the n-gram lattice drafter and verifies the top-1 chain (`ChainPolicy`): it accepts
the longest prefix of the chain that equals the target's argmax and appends the target's next
argmax (the bonus token); rollback of the rejected rows is moving `pos`. On an exact pass the
output is the AR output token for token (the greedy argmax of the same prefix).

Mechanisms (refspec/ext/) plug in without editing this file: a verification policy replaces
`ChainPolicy` (a tree builds its rows, depths and mask and walks the target's argmax), draft
filters cut the lattice first, and a head replaces the LM head's argmax.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from . import ext
from .config import Config
from .drafter import Lattice, NgramDrafter
from .errors import RefspecError
from .model import region


@dataclass
class Stats:
    steps: int = 0  # verification passes (the prefill commits nothing and is not a step)
    new_tokens: int = 0
    rows: int = 0  # rows verified over all steps

    @property
    def tau(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    def to_json(self) -> dict:
        return {"steps": self.steps, "new_tokens": self.new_tokens, "tau": self.tau}


def check_prompt(input_ids: list[int], vocab: int) -> None:
    if not input_ids:
        raise RefspecError("input_ids is empty; a request needs at least one prompt token")
    if any(not 0 <= t < vocab for t in input_ids):
        raise RefspecError(f"input_ids holds a token outside the vocabulary [0, {vocab})")


class ChainPolicy:
    """Stock: verify the lattice's top-1 chain; accept its longest prefix equal to the target's argmax."""

    def __init__(self, block_size: int):
        self.max_rows = block_size + 1

    def propose(self, engine: Engine, lattice: Lattice, remaining: int) -> ext.Pass:
        # A longer chain than remaining - 1 could only be truncated away.
        chain = lattice.chain()[: max(remaining - 1, 0)]
        return ext.Pass([engine.last, *chain], list(range(len(chain) + 1)))

    def accept(self, engine: Engine, p: ext.Pass, target: list[int]) -> tuple[list[int], list[int]]:
        chain = p.tokens[1:]
        accepted = 0
        while accepted < len(chain) and chain[accepted] == target[accepted]:
            accepted += 1
        return [*chain[:accepted], target[accepted]], list(range(1, accepted + 1))


class Engine:
    """One model (CPU `Transformer` or `CudaModel`), its KV cache and the drafter, batch 1."""

    def __init__(self, model: Any, config: Config, mechanisms: Sequence[tuple[ext.Mechanism, Any]] = ()):
        self.model, self.config = model, config
        self.drafter = NgramDrafter(config.drafter.max_ngram, config.drafter.min_ngram)
        self.device = model.device
        self.pos = 0  # cache slots [0, pos) hold the K/V of the committed prefix minus `last`
        self.last = 0  # the last committed token
        self.drafting = False
        self.rows = 0  # rows verified by the latest step
        self.chain = ChainPolicy(config.decode.block_size)  # stock's, and every AR step's
        self.policy: ext.Policy = self.chain
        self.filters = [(m.draft, k) for m, k in mechanisms if m.draft]
        self.head: ext.Head | None = None
        for m, knobs in mechanisms:
            if m.policy:
                self.policy = m.policy(self, knobs)
            if m.head:
                self.head = m.head(self, knobs)
        self.batch_policy: ext.BatchPolicy | None = None  # batch serving's, after the policy is set
        for m, knobs in mechanisms:
            if m.batch:
                self.batch_policy = m.batch(self, knobs)
        for m, knobs in mechanisms:
            if m.setup:
                m.setup(self, knobs)

    # -- the verification pass -----------------------------------------------------------------

    def verify(self, p: ext.Pass) -> list[int]:
        """The target's argmax after each row of the pass (rows at slots pos, pos+1, ...)."""
        positions = [self.pos + d for d in p.depth]
        return self.model.verify(p.tokens, positions, self.pos, p.mask, self.head)

    # -- one request ---------------------------------------------------------------------------

    def start(self, input_ids: list[int], max_new_tokens: int, drafting: bool) -> None:
        """Prefill the prompt (all but its last token, which the first step verifies)."""
        check_prompt(input_ids, self.model.args.vocab)
        self.model.setup_cache(1, len(input_ids) + max_new_tokens + self.policy.max_rows)
        self.model.prefill(input_ids[:-1], 0)
        self.pos, self.last = len(input_ids) - 1, input_ids[-1]
        self.drafting = drafting
        if drafting:
            with region("drafter"):
                self.drafter.reset(list(input_ids))

    def draft(self, chain_only: bool = False) -> Lattice:
        """The drafter's lattice for the committed prefix, after the mechanisms' filters.

        chain_only: the top-1 candidate a position and no parent-conditioned ranks, all that
        stock's chain verifies (the same chain); taken only with no filter and stock's policy.
        """
        d = self.config.decode
        with region("drafter"):
            if chain_only and not self.filters and self.policy is self.chain:
                return self.drafter.draft(d.block_size, 1, cond=False)
            lattice = self.drafter.draft(d.block_size, d.top_k)
            for fn, knobs in self.filters:
                lattice = fn(lattice, knobs)
            return lattice

    def step(self, p: ext.Pass, policy: ext.Policy | None = None) -> list[int]:
        """Verify a pass of `policy` (default the engine's); commit the accepted rows and the bonus
        token; return the committed tokens."""
        self.rows = len(p.tokens)
        target = self.verify(p)
        with region("other"):
            committed, path = (policy or self.policy).accept(self, p, target)
            if path != list(range(1, len(path) + 1)):  # a tree's path: its K/V moves next to the prefix
                self.model.move_kv(
                    [self.pos + r for r in path], list(range(self.pos + 1, self.pos + 1 + len(path)))
                )
        # Slots pos .. pos+len(path) now hold last + the accepted rows; the rest is rolled back.
        self.pos += len(path) + 1
        self.last = committed[-1]
        if self.drafting:
            with region("drafter"):
                self.drafter.extend(committed)
        return committed

    def decode_step(self, mode: str, remaining: int) -> list[int]:
        """One decode step (draft + verify + accept) committing at most `remaining` tokens."""
        if mode == "spec":
            return self.step(self.policy.propose(self, self.draft(chain_only=True), remaining))
        return self.step(ext.Pass([self.last], [0]), self.chain)

    def generate(
        self, input_ids: list[int], max_new_tokens: int, mode: str | None = None
    ) -> Iterator[list[int]]:
        """Greedy decoding of exactly max_new_tokens tokens (EOS ignored), yielded per step.

        The stats of the run are in `self.stats` once the iterator is exhausted.
        """
        mode = mode or self.config.decode.mode
        if mode not in ("spec", "ar"):
            raise RefspecError(f"unknown decode mode {mode!r}; use spec or ar")
        self.stats = stats = Stats()
        self.start(input_ids, max_new_tokens, drafting=mode == "spec")
        while stats.new_tokens < max_new_tokens:
            remaining = max_new_tokens - stats.new_tokens
            committed = self.decode_step(mode, remaining)[:remaining]
            stats.steps += 1
            stats.rows += self.rows
            stats.new_tokens += len(committed)
            yield committed


def greedy(
    engine: Engine, input_ids: list[int], max_new_tokens: int, mode: str | None = None
) -> tuple[list[int], Stats]:
    """All tokens of one greedy run and its stats."""
    out: list[int] = []
    for chunk in engine.generate(input_ids, max_new_tokens, mode):
        out.extend(chunk)
    return out, engine.stats
