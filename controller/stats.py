"""Paired, slot-swapped statistics and the approval rule (ARCHITECTURE §5).

A block has two periods with fresh processes. Period 1 runs baseline A on one slot and candidate B
on the other, concurrently, with the same requests; period 2 swaps the slots. For request i

    d_i = ½ [ log(v_B,s1 / v_A,s0) + log(v_B,s0 / v_A,s1) ]

where v is output speed (tokens per second of the controller's own clock). A slot that runs
everything k times faster multiplies both a numerator and a denominator by k, so it cancels.
A block's gain is exp(mean_i d_i). With at least `MIN_BLOCKS_AS_UNIT` blocks the block is the unit
of inference (block means are independent); with fewer, the requests are (and the report says so).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

MIN_BLOCKS_AS_UNIT = 5


@dataclass(frozen=True)
class RequestSpeeds:
    """Output speeds (tokens/s) of one request in one block, for both systems on both slots."""

    a_s0: float
    a_s1: float
    b_s0: float
    b_s1: float

    def log_ratio(self) -> float:
        """Swap-averaged log speed ratio d_i of candidate B over baseline A."""
        return 0.5 * (math.log(self.b_s1 / self.a_s0) + math.log(self.b_s0 / self.a_s1))


@dataclass(frozen=True)
class PairedStats:
    """The gain of B over A with its one-sided 95% lower bound."""

    gain: float  # geometric-mean speed ratio B/A
    lower_bound: float  # one-sided 95% lower bound of `gain`
    unit: str  # "blocks" or "requests"
    n: int  # sample size in that unit
    block_gains: list[float] = field(default_factory=list)
    log_sd: float = 0.0  # standard deviation of the unit's log ratios


def paired_stats(blocks: Sequence[Sequence[RequestSpeeds]]) -> PairedStats:
    """Gain and one-sided 95% lower bound from blocks of per-request speeds."""
    if not blocks or any(len(b) == 0 for b in blocks):
        raise ValueError("every block needs at least one request")
    per_block = [np.array([r.log_ratio() for r in b]) for b in blocks]
    block_means = np.array([d.mean() for d in per_block])
    if len(blocks) >= MIN_BLOCKS_AS_UNIT:
        unit, sample = "blocks", block_means
    else:
        unit, sample = "requests", np.concatenate(per_block)
    mean = float(sample.mean())
    if len(sample) < 2:
        low, sd = -math.inf, 0.0
    else:
        sd = float(sample.std(ddof=1))
        if sd == 0.0:
            low = mean  # identical samples: no spread to bound
        else:
            low = float(stats.ttest_1samp(sample, 0.0, alternative="greater").confidence_interval(0.95).low)
    return PairedStats(
        gain=math.exp(mean),
        lower_bound=math.exp(low),
        unit=unit,
        n=len(sample),
        block_gains=[math.exp(m) for m in block_means],
        log_sd=sd,
    )


def noise_sigma(aa: PairedStats) -> float:
    """Stock noise σ from a stock-vs-stock (A/A) run: the standard error of its gain.

    A fraction (0.004 = 0.4%): how far a measured gain wanders when nothing changed, in the same
    design (blocks, requests, slots) a comparison uses. The lower bound already accounts for a
    candidate's own spread; the bar 1% + 2σ adds a margin for what stock against itself shows.
    """
    return math.expm1(aa.log_sd / math.sqrt(aa.n)) if aa.n > 1 else 0.0


def within_request_spread(blocks: Sequence[Sequence[RequestSpeeds]]) -> tuple[float, int]:
    """Variance of each request's log ratio across blocks around its own mean, and its degrees of freedom.

    The same request measured in different blocks differs only by measurement noise: a candidate
    that helps some requests more than others does not widen it, a disturbed period does.
    """
    if len(blocks) < 2:
        return math.nan, 0
    d = np.array([[r.log_ratio() for r in b] for b in blocks])  # blocks x requests
    resid = d - d.mean(axis=0)
    df = d.shape[1] * (d.shape[0] - 1)
    return float((resid**2).sum() / df), df


def noisier_than_stock(var: float, df: int, stock_var: float, stock_df: int) -> float:
    """One-sided F-test p-value that a comparison's within-request spread exceeds stock's A/A spread."""
    if df < 1 or stock_df < 1 or not stock_var > 0:
        return 1.0
    return float(stats.f.sf(var / stock_var, df, stock_df))


@dataclass(frozen=True)
class Verdict:
    approved: bool
    threshold: float  # the lower bound must exceed 1 + threshold
    reasons: list[str]  # why not approved (empty when approved) — the audit adds its own
    notes: list[str]  # facts stated in every report (unit of inference, flags)


def decide(
    paired: PairedStats,
    sigma: float,
    *,
    changes_output: bool,
    min_gain: float = 0.01,
    output_change_gain: float = 0.03,
    implausible_gain: float = 3.0,
    extra_reasons: Sequence[str] = (),
) -> Verdict:
    """Approve when the lower bound clears the bar and nothing else objects.

    Bar: lower bound > 1 + min_gain + 2σ, or > 1 + output_change_gain (+ 2σ) when the candidate's
    tokens differ from the baseline's. A gain above `implausible_gain` is flagged for review and
    never approved automatically.
    """
    base = output_change_gain if changes_output else min_gain
    threshold = base + 2 * sigma
    reasons = list(extra_reasons)
    notes = [f"unit of inference: {paired.unit} (n = {paired.n})"]
    if paired.lower_bound <= 1 + threshold:
        why = "output changes, so the bar is " if changes_output else ""
        reasons.append(
            f"lower bound {paired.lower_bound - 1:+.2%} does not exceed {why}"
            f"{base:.0%} + 2σ = {threshold:.2%}"
        )
    if paired.gain > implausible_gain:
        reasons.append(f"gain {paired.gain:.2f}x is implausibly large: flagged for review, not approved")
    if changes_output:
        notes.append("the candidate's output tokens differ from the baseline's")
    return Verdict(approved=not reasons, threshold=threshold, reasons=reasons, notes=notes)
