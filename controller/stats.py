"""Paired statistics and the approval rule (ARCHITECTURE §5), as a sequential design.

The unit of inference is the block: each block starts fresh processes, so block means are
independent, while requests served by the same processes are not. Per request i of a block:

- swapped design (two slots, `RequestSpeeds`):  d_i = ½ [log(v_B,s1 / v_A,s0) + log(v_B,s0 / v_A,s1)]
  where v is output speed on the controller's clock; a slot k times faster cancels;
- sliced design (CPU slots, `PairSpeeds`):  d_i = log(v_B / v_A), both systems serving on one core
  in ~50 ms turns, v from the time each system ran (a block: one core's pair of processes);
- interleaved design (one GPU slot, `PairSpeeds`):  d_i = log(v_B / v_A), a turn per request in ABBA
  order, so a request's two runs are adjacent and a linear drift cancels over each two requests.

A block's log gain is mean_i d_i. Stock noise σ is the standard error of the gain stock gets
against itself (A/A) in the same design, from the block log gains of every A/A comparison of the
deployment pooled (`pooled_sd`), at the comparison's number of blocks (`sigma_for`).

Approval: the one-sided lower bound of the geometric-mean gain exceeds 1 + min_gain + 2σ (3% + 2σ
when the output changes). Blocks are added while the verdict is undecided (`look`): after each
round once MIN_LOOK quiet blocks are in, the candidate is approved when the lower bound at level α_k
clears the bar, and rejected when the upper bound at level β_k falls below it. α_k is the
increment since the previous look of the Lan–DeMets Pocock-type spending function
α(t) = α ln(1 + (e − 1) t), t = k / K_max (Lan & DeMets, Biometrika 70:659, 1983), and each look is
a t-test at its increment, so by the union bound the
chance of approving a candidate whose gain is at or below the bar is at most α over all looks
(conservative: it ignores the correlation between looks). Rejection for futility does not add
to that chance (it never approves), whatever β_k (spent the same way from β).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

ALPHA = 0.05  # chance of approving a candidate whose true gain is at or below the bar
BETA = 0.10  # spent on stopping early for futility (affects power, never false approvals)
MIN_LOOK = 3  # blocks before the first look (two degrees of freedom)


@dataclass(frozen=True)
class RequestSpeeds:
    """Output speeds (tokens/s) of one request in one swapped block, both systems on both slots."""

    a_s0: float
    a_s1: float
    b_s0: float
    b_s1: float

    def log_ratio(self) -> float:
        """Swap-averaged log speed ratio d_i of candidate B over baseline A."""
        return 0.5 * (math.log(self.b_s1 / self.a_s0) + math.log(self.b_s0 / self.a_s1))


@dataclass(frozen=True)
class PairSpeeds:
    """Output speeds of one request in one sliced or interleaved block (each system served it once)."""

    a: float
    b: float

    def log_ratio(self) -> float:
        return math.log(self.b / self.a)


@dataclass(frozen=True)
class PairedStats:
    """The gain of B over A with its one-sided lower bound, blocks as the unit."""

    gain: float  # geometric-mean speed ratio B/A
    lower_bound: float  # one-sided lower bound of `gain` at `level`
    n: int  # blocks
    block_gains: list[float] = field(default_factory=list)
    log_sd: float = 0.0  # standard deviation of the block log gains
    upper_bound: float = math.inf  # one-sided upper bound at the futility level of the look
    level: float = ALPHA
    unit: str = "blocks"


def block_logs(blocks: Sequence[Sequence]) -> np.ndarray:
    if not blocks or any(len(b) == 0 for b in blocks):
        raise ValueError("every block needs at least one request")
    return np.array([np.mean([r.log_ratio() for r in b]) for b in blocks])


def _t_bound(sample: np.ndarray, level: float, upper: bool) -> float:
    n = len(sample)
    if n < 2:
        return math.inf if upper else -math.inf
    mean, sd = float(sample.mean()), float(sample.std(ddof=1))
    if sd == 0.0:
        return mean  # identical blocks: no spread to bound
    q = float(stats.t.ppf(1 - level, n - 1)) * sd / math.sqrt(n)
    return mean + q if upper else mean - q


def paired_stats(blocks: Sequence[Sequence], level: float = ALPHA, futility: float = BETA) -> PairedStats:
    """Gain, one-sided lower bound at `level` and upper bound at `futility`, from blocks of speeds."""
    logs = block_logs(blocks)
    return PairedStats(
        gain=math.exp(float(logs.mean())),
        lower_bound=math.exp(_t_bound(logs, level, upper=False)),
        upper_bound=math.exp(_t_bound(logs, futility, upper=True)),
        n=len(logs),
        block_gains=[math.exp(m) for m in logs],
        log_sd=float(logs.std(ddof=1)) if len(logs) > 1 else 0.0,
        level=level,
    )


def pooled_sd(runs: Sequence[Sequence[float]]) -> tuple[float, int]:
    """Pooled standard deviation of block log gains over A/A comparisons, and its degrees of freedom."""
    ss = sum(float(((np.asarray(r) - np.mean(r)) ** 2).sum()) for r in runs if len(r) > 1)
    df = sum(len(r) - 1 for r in runs if len(r) > 1)
    return (math.sqrt(ss / df), df) if df else (0.0, 0)


def sigma_for(sd: float, n: int) -> float:
    """σ: the standard error of an A/A gain of n blocks (a fraction: 0.004 = 0.4%)."""
    return math.expm1(sd / math.sqrt(n)) if n > 0 else 0.0


def spent(k: int, k_max: int, total: float) -> float:
    """Lan–DeMets Pocock-type spending: the error spent by look k of k_max."""
    t = min(1.0, k / k_max)
    return total * math.log(1 + (math.e - 1) * t)


def look_levels(k: int, k_max: int, prev: int = 0) -> tuple[float, float]:
    """(α_k, β_k): this look's share of the false-approval and futility errors — what the spending
    function spent between the previous look, at `prev` blocks (0: this is the first), and this
    one at `k`. Looks may skip block counts (a sliced round adds a block per slot)."""
    frac = spent(k, k_max, 1.0) - spent(prev, k_max, 1.0)
    return ALPHA * frac, BETA * frac


@dataclass(frozen=True)
class Verdict:
    approved: bool
    decided: bool  # the look settled it (approved or rejected); False: more blocks would be needed
    threshold: float  # the lower bound must exceed 1 + threshold
    reasons: list[str]  # why not approved (empty when approved) — the audit adds its own
    notes: list[str]  # facts stated in every report (unit of inference, looks)


def decide(
    paired: PairedStats,
    sigma: float,
    *,
    changes_output: bool,
    min_gain: float = 0.01,
    output_change_gain: float = 0.03,
    implausible_gain: float = 3.0,
    extra_reasons: Sequence[str] = (),
    final: bool = True,
) -> Verdict:
    """Approve when the lower bound clears the bar and nothing else objects.

    Bar: lower bound > 1 + min_gain + 2σ, or > 1 + output_change_gain + 2σ when the candidate's
    tokens differ from the baseline's. Undecided (`decided` False) while neither bound has crossed
    the bar and this is not the `final` look. A gain above `implausible_gain` is flagged for
    review and never approved automatically.
    """
    base = output_change_gain if changes_output else min_gain
    threshold = base + 2 * sigma
    bar = 1 + threshold
    reasons = list(extra_reasons)
    notes = [f"unit of inference: blocks (n = {paired.n}, one-sided level {paired.level:.2g} at this look)"]
    cleared = paired.lower_bound > bar
    if not cleared:
        why = "output changes, so the bar is " if changes_output else ""
        reasons.append(
            f"lower bound {paired.lower_bound - 1:+.2%} does not exceed {why}{base:.0%} + 2σ = {threshold:.2%}"
        )
    if paired.gain > implausible_gain:
        reasons.append(f"gain {paired.gain:.2f}x is implausibly large: flagged for review, not approved")
    if changes_output:
        notes.append("the candidate's output tokens differ from the baseline's")
    decided = final or cleared or paired.upper_bound < bar or bool(extra_reasons)
    return Verdict(approved=not reasons, decided=decided, threshold=threshold, reasons=reasons, notes=notes)
