"""Token-forcing audit statistics (ARCHITECTURE §6, paper §3.4).

The scorer — the stock target with an FP32 LM head — is run teacher-forced over prompt + a system's
output. A position is a mismatch when the system's token differs from the scorer's argmax; its
margin is log p(argmax) − log p(system token) ≥ 0. Phase 0 sets the near-tie threshold δ from the
margins where stock first diverges from AR. A candidate is rejected
- when it has more mismatches than stock's own rate allows on as many positions: a one-sided
  binomial test at stock's measured rate (raised by its standard error, as the rate is itself
  measured), α = 0.05. The tolerance scales with stock's rate and the positions scored: where
  stock reproduces the scorer exactly (every CPU deployment) it allows none. Exact ties (margin
  under `TIE` nats, where a change in summation order may pick either token) are not counted;
- or when its large mismatches (margin ≥ 2δ) are significantly more frequent than stock's: a
  one-sided Fisher exact test on the 2×2 table (large events, other positions) × (candidate,
  stock), p < 0.05.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

DELTA_STEP = 1 / 8
RATE_ALPHA = 0.05
TIE = 1e-3  # nats: a mismatch this close to the argmax is a tie in floating point, not a departure
LARGE_EVENT_ALPHA = 0.05


@dataclass(frozen=True)
class ScoredOutput:
    """One request's output as the scorer sees it."""

    id: str
    tokens: list[int]  # the system's output tokens
    argmax: list[int]  # the scorer's argmax at each output position
    margins: list[float]  # log p(argmax) − log p(system token); 0.0 where they agree

    def mismatches(self) -> list[int]:
        return [i for i, (t, a) in enumerate(zip(self.tokens, self.argmax, strict=True)) if t != a]


def calibrate_delta(first_divergence_margins: Sequence[float]) -> float:
    """δ = the largest margin at a first stock-vs-AR divergence, rounded up to a multiple of 1/8.

    With no divergence at all (stock reproduced AR exactly) δ is the smallest step, 1/8, so 2δ
    still separates near-ties from real departures.
    """
    worst = max(first_divergence_margins, default=0.0)
    return max(DELTA_STEP, math.ceil(worst / DELTA_STEP - 1e-9) * DELTA_STEP)


@dataclass(frozen=True)
class Event:
    """A large mismatch: margin ≥ 2δ."""

    id: str
    position: int
    token: int
    argmax: int
    margin: float
    explained: bool  # stock mismatches at the same (request, position) too


@dataclass(frozen=True)
class AuditResult:
    positions: int
    mismatches: int
    rate: float
    stock_positions: int
    stock_mismatches: int
    stock_rate: float
    delta: float
    events: list[Event]
    stock_events: int
    p_large: float  # one-sided Fisher p: candidate large events more frequent than stock's
    reasons: list[str]  # why rejected; empty = passes

    @property
    def passed(self) -> bool:
        return not self.reasons

    @property
    def unexplained(self) -> list[Event]:
        return [e for e in self.events if not e.explained]


def _counts(outputs: Sequence[ScoredOutput], threshold: float) -> tuple[int, int, int]:
    """(positions, mismatches that are not exact ties, large mismatches)."""
    positions = sum(len(o.tokens) for o in outputs)
    mism = sum(1 for o in outputs for i in o.mismatches() if o.margins[i] >= TIE)
    large = sum(1 for o in outputs for m in o.margins if m >= threshold)
    return positions, mism, large


def allowed_mismatches(positions: int, stock_mismatches: int, stock_positions: int) -> int:
    """The most mismatches `positions` may hold at stock's rate: the largest count a one-sided
    binomial test at stock's rate plus its standard error does not reject (0 where stock's is 0)."""
    p = stock_mismatches / stock_positions if stock_positions else 0.0
    p_hi = min(1.0, p + math.sqrt(p * (1 - p) / stock_positions)) if stock_positions else 0.0
    return int(stats.binom.isf(RATE_ALPHA, positions, p_hi)) if p_hi > 0 and positions else 0


def audit(
    candidate: Sequence[ScoredOutput],
    stock: Sequence[ScoredOutput],
    delta: float,
    explained_at: set[tuple[str, int]] | None = None,
) -> AuditResult:
    """Compare a candidate's token-forcing figures with stock's (rates: the requests may differ).

    A large mismatch is explained where stock mismatches at the same (request, position), or,
    given `explained_at` (the positions where the baseline of the same run chose the same token),
    there.
    """
    large_at = 2 * delta
    pos, mism, large = _counts(candidate, large_at)
    s_pos, s_mism, s_large = _counts(stock, large_at)
    stock_mismatch_at = (
        explained_at if explained_at is not None else {(o.id, i) for o in stock for i in o.mismatches()}
    )
    events = [
        Event(o.id, i, o.tokens[i], o.argmax[i], o.margins[i], (o.id, i) in stock_mismatch_at)
        for o in candidate
        for i in o.mismatches()
        if o.margins[i] >= large_at
    ]
    rate = mism / pos if pos else 0.0
    s_rate = s_mism / s_pos if s_pos else 0.0
    table = np.array([[large, pos - large], [s_large, s_pos - s_large]])
    p_large = float(stats.fisher_exact(table, alternative="greater").pvalue) if pos and s_pos else 1.0
    reasons = []
    allowed = allowed_mismatches(pos, s_mism, s_pos)
    if mism > allowed:
        reasons.append(
            f"audit: {mism} mismatches in {pos} positions ({rate:.2%}) where stock's rate, {s_rate:.2%} "
            f"({s_mism}/{s_pos}), allows at most {allowed} (one-sided binomial, α = {RATE_ALPHA})"
        )
    if p_large < LARGE_EVENT_ALPHA:
        reasons.append(
            f"audit: {large} mismatches with margin >= 2δ = {large_at:.3f} vs stock's {s_large} "
            f"(one-sided Fisher exact p = {p_large:.2g} < {LARGE_EVENT_ALPHA})"
        )
    return AuditResult(pos, mism, rate, s_pos, s_mism, s_rate, delta, events, s_large, p_large, reasons)
