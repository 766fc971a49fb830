"""The n-gram lattice drafter: per-position candidates from suffix matches in the context.

Over the context c (prompt + committed tokens), for n from max_ngram down to min_ngram, the
earlier occurrences of c's last n tokens are looked up; the first n with any occurrence is used.
An occurrence ending at index i continues with c[i+1 : i+1+m]. Draft position d's candidates are
the tokens c[i+1+d] over the occurrences that reach d, ranked by count (ties: the most recent
occurrence first), with logp = log(count / occurrences reaching d). cond[d][parent] ranks the same
tokens among the occurrences whose c[i+d] == parent, for tree builders that condition on the
parent. The index (n-gram -> end indices) grows as tokens are committed, so a draft costs time
in the number of occurrences, never a rescan of the context.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field


@dataclass
class Lattice:
    tokens: list[list[int]] = field(
        default_factory=list
    )  # [m][k]: candidates at draft position d, best first
    logp: list[list[float]] = field(default_factory=list)  # same shape: log p under the drafter
    cond: list[dict[int, list[tuple[int, float]]]] = field(default_factory=list)  # cond[d][parent] -> ranked

    def chain(self) -> list[int]:
        """Stock's verification chain: the top-1 candidate at every position."""
        return [cands[0] for cands in self.tokens]

    def to_json(self) -> dict:
        return {
            "tokens": self.tokens,
            "logp": self.logp,
            "cond": [{str(p): [[t, lp] for t, lp in ranked] for p, ranked in c.items()} for c in self.cond],
        }

    @classmethod
    def from_json(cls, data: dict) -> Lattice:
        cond = [
            {int(p): [(int(t), float(lp)) for t, lp in ranked] for p, ranked in c.items()}
            for c in data["cond"]
        ]
        return cls(tokens=data["tokens"], logp=data["logp"], cond=cond)


def _rank(counts: dict[int, list[int]], k: int) -> list[tuple[int, float]]:
    """counts: token -> [count, most recent end index]; the top k as (token, log(count/total))."""
    total = sum(c for c, _ in counts.values())
    if k == 1:  # [count, recent] lists compare as the ranking's key: count, then recency
        tok, (c, _) = max(counts.items(), key=lambda kv: kv[1])
        return [(tok, math.log(c / total))]
    best = sorted(counts.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))[:k]
    return [(tok, math.log(c / total)) for tok, (c, _) in best]


class NgramDrafter:
    """Incremental n-gram index over one request's context; `draft` builds a Lattice."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.context: list[int] = []
        self.index: dict[tuple[int, ...], list[int]] = {}  # n-gram -> end indices, increasing

    def reset(self, prompt: list[int]) -> None:
        """Start a new request whose context is the prompt."""
        self.context, self.index = [], {}
        self.extend(prompt)

    def extend(self, tokens: list[int]) -> None:
        """Commit tokens to the context and index every n-gram ending at them."""
        c, index = self.context, self.index
        for t in tokens:
            c.append(t)
            j = len(c) - 1
            for n in range(self.min_ngram, min(self.max_ngram, j + 1) + 1):
                key = tuple(c[j - n + 1 : j + 1])
                ends = index.get(key)
                if ends is None:
                    index[key] = [j]
                else:
                    ends.append(j)

    def occurrences(self) -> list[int]:
        """End indices of the earlier occurrences of the longest matching suffix (none: [])."""
        c = self.context
        last = len(c) - 1
        for n in range(min(self.max_ngram, len(c)), self.min_ngram - 1, -1):
            ends = self.index.get(tuple(c[last - n + 1 :]))
            # The suffix itself is the last entry (end index = last); the rest are earlier.
            if ends is not None and len(ends) > 1:
                return ends[:-1]
        return []

    def draft(self, m: int, k: int, cond: bool = True) -> Lattice:
        """The lattice of m draft positions (fewer where no occurrence reaches) with top-k candidates.

        cond=False leaves `cond` empty: stock's chain reads only each position's top-1, and
        `draft(m, 1, cond=False).chain() == draft(m, k).chain()` for every k, at a fraction of the cost.
        """
        c = self.context
        size = len(c)
        occ = self.occurrences()
        lat = Lattice()
        for d in range(m):
            # Occurrences are increasing, so those reaching d (i + 1 + d < size) are a prefix.
            live = occ[: bisect_left(occ, size - 1 - d)]
            if len(live) <= 1:  # none, or one occurrence: its continuation, each token p = 1
                i = live[0] if live else size
                for e in range(d, min(m, size - 1 - i)):
                    lat.tokens.append([c[i + 1 + e]])
                    lat.logp.append([0.0])
                    if cond:
                        lat.cond.append({c[i + e]: [(c[i + 1 + e], 0.0)]} if e else {})
                break
            counts: dict[int, list[int]] = {}
            by_parent: dict[int, dict[int, list[int]]] = {}
            for i in live:
                tok = c[i + 1 + d]
                entry = counts.get(tok)
                if entry is None:
                    counts[tok] = [1, i]
                else:
                    entry[0] += 1
                    entry[1] = i
                if cond and d:
                    sub = by_parent.setdefault(c[i + d], {})
                    entry = sub.get(tok)
                    if entry is None:
                        sub[tok] = [1, i]
                    else:
                        entry[0] += 1
                        entry[1] = i
            ranked = _rank(counts, k)
            lat.tokens.append([t for t, _ in ranked])
            lat.logp.append([lp for _, lp in ranked])
            if cond:
                lat.cond.append({p: _rank(sub, k) for p, sub in by_parent.items()})
            occ = live
        return lat
