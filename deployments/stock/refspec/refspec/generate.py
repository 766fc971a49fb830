"""Prefill, greedy AR and stock speculative decoding over one request at a time.

Every decode step is one verification pass: its rows are the last committed token (whose K/V is
not in the cache yet) followed by the draft, at cache slots and positions pos, pos+1, ...; row r
predicts the token after row r. AR is the same step with no draft. Stock speculative decoding
drafts m positions with the n-gram lattice drafter and verifies the top-1 chain: it accepts the
longest prefix of the chain that equals the target's argmax and appends the target's next argmax
(the bonus token); rollback of the rejected rows is moving `pos`. On an exact pass the output is
the AR output token for token (the greedy argmax of the same prefix).

`verify` takes rows, positions, slots and a mask, so a tree entry only has to build those from its
tree and compact the accepted path's K/V.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .config import Config
from .drafter import Lattice, NgramDrafter
from .errors import RefspecError
from .model import Transformer, region

PREFILL_CHUNK = 256  # prompt rows per prefill pass (bounds the [rows, kv_len] score buffers)


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


class Engine:
    """One model, its KV cache and the drafter, decoding one request at a time (batch 1)."""

    def __init__(self, model: Transformer, config: Config):
        self.model, self.config = model, config
        self.drafter = NgramDrafter(config.drafter.max_ngram, config.drafter.min_ngram)
        self.device = model.device
        self.pos = 0  # cache slots [0, pos) hold the K/V of the committed prefix minus `last`
        self.last = 0  # the last committed token
        self.drafting = False
        self.rows = 0  # rows verified by the latest step
        m = config.decode.block_size + 1
        self._tri = torch.ones(m, m, dtype=torch.bool, device=self.device).tril()

    # -- the verification pass -----------------------------------------------------------------

    def verify(
        self,
        rows: list[int],
        positions: torch.Tensor,
        slots: torch.Tensor | int,
        mask: torch.Tensor | None,
        kv_len: int,
    ) -> list[int]:
        """The target's argmax after each row (see Transformer.forward for the arguments)."""
        tokens = torch.tensor([rows], dtype=torch.long, device=self.device)
        logits = self.model.forward(tokens, positions, slots, mask, kv_len)
        with region("other"):
            return logits[0].argmax(dim=-1).tolist()

    def _chain_mask(self, rows: int) -> torch.Tensor | None:
        """Causal mask of `rows` consecutive rows at slot pos over kv_len = pos + rows slots."""
        if rows == 1:
            return None  # one row attends to every slot up to and including its own
        mask = torch.ones(rows, self.pos + rows, dtype=torch.bool, device=self.device)
        mask[:, self.pos :] = self._tri[:rows, :rows]
        return mask

    # -- one request ---------------------------------------------------------------------------

    def start(self, input_ids: list[int], max_new_tokens: int, drafting: bool) -> None:
        """Prefill the prompt (all but its last token, which the first step verifies)."""
        if not input_ids:
            raise RefspecError("input_ids is empty; a request needs at least one prompt token")
        vocab = self.model.args.vocab
        if any(not 0 <= t < vocab for t in input_ids):
            raise RefspecError(f"input_ids holds a token outside the vocabulary [0, {vocab})")
        self.model.setup_cache(1, len(input_ids) + max_new_tokens + self.config.decode.block_size + 1)
        prompt = input_ids[:-1]
        for s in range(0, len(prompt), PREFILL_CHUNK):
            chunk = prompt[s : s + PREFILL_CHUNK]
            n = len(chunk)
            mask = torch.ones(n, s + n, dtype=torch.bool, device=self.device)
            mask[:, s:] = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
            positions = torch.arange(s, s + n, device=self.device)
            tokens = torch.tensor([chunk], dtype=torch.long, device=self.device)
            self.model.forward(tokens, positions, s, mask, s + n, logits_rows=None)
        self.pos, self.last = len(prompt), input_ids[-1]
        self.drafting = drafting
        if drafting:
            with region("drafter"):
                self.drafter.reset(list(input_ids))

    def draft(self) -> Lattice:
        """The drafter's lattice for the committed prefix."""
        d = self.config.decode
        with region("drafter"):
            return self.drafter.draft(d.block_size, d.top_k)

    def step(self, chain: list[int]) -> list[int]:
        """Verify [last] + chain; commit the accepted prefix and the bonus token; return them."""
        rows = [self.last, *chain]
        n = self.rows = len(rows)
        positions = torch.arange(self.pos, self.pos + n, device=self.device)
        with region("other"):
            mask = self._chain_mask(n)
        target = self.verify(rows, positions, self.pos, mask, self.pos + n)
        accepted = 0
        while accepted < len(chain) and chain[accepted] == target[accepted]:
            accepted += 1
        committed = [*chain[:accepted], target[accepted]]
        # Slots pos .. pos+accepted now hold last + the accepted chain; the rest is rolled back.
        self.pos += accepted + 1
        self.last = committed[-1]
        if self.drafting:
            with region("drafter"):
                self.drafter.extend(committed)
        return committed

    def decode_step(self, mode: str, remaining: int) -> list[int]:
        """One decode step (draft + verify + accept) committing at most `remaining` tokens."""
        chain: list[int] = []
        if mode == "spec":
            # A longer chain than remaining - 1 could only be truncated away.
            chain = self.draft().chain()[: max(remaining - 1, 0)]
        return self.step(chain)

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
