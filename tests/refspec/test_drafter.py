"""The n-gram lattice drafter against CONTRACTS §3, by hand and against a plain rescan."""

from __future__ import annotations

import json
import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from refspec.drafter import Lattice, NgramDrafter


def reference(c: list[int], m: int, k: int, max_n: int, min_n: int) -> Lattice:
    """CONTRACTS §3 read literally: rescan the whole context for every draft."""
    size = len(c)
    occ: list[int] = []
    for n in range(min(max_n, size), min_n - 1, -1):
        occ = [i for i in range(n - 1, size - 1) if c[i - n + 1 : i + 1] == c[size - n :]]
        if occ:
            break
    lat = Lattice()
    for d in range(m):
        live = [i for i in occ if i + 1 + d < size]
        if not live:
            break

        def rank(sel: list[int], d: int = d) -> list[tuple[int, float]]:
            count = Counter(c[i + 1 + d] for i in sel)
            recent = {t: max(i for i in sel if c[i + 1 + d] == t) for t in count}
            order = sorted(count, key=lambda t: (-count[t], -recent[t]))[:k]
            return [(t, math.log(count[t] / len(sel))) for t in order]

        ranked = rank(live)
        lat.tokens.append([t for t, _ in ranked])
        lat.logp.append([lp for _, lp in ranked])
        parents = {c[i + d] for i in live} if d else set()
        lat.cond.append({p: rank([i for i in live if c[i + d] == p]) for p in parents})
    return lat


def drafted(context: list[int], m: int = 8, k: int = 16, max_n: int = 4, min_n: int = 1) -> Lattice:
    drafter = NgramDrafter(max_n, min_n)
    drafter.reset(context)
    return drafter.draft(m, k)


def test_longest_suffix_match_and_recency_tie_break():
    # Suffix [1, 2] (no longer match) occurs ending at 1 and 4: continuations 3 1 2 4 1 2 and 4 1 2.
    lat = drafted([1, 2, 3, 1, 2, 4, 1, 2], m=4)
    assert lat.tokens == [[4, 3], [1], [2], [4]]  # d=0: a 1-1 tie, the occurrence at 4 is more recent
    assert lat.logp == [[math.log(0.5)] * 2, [0.0], [0.0], [0.0]]  # d=3 is reached by one occurrence
    assert lat.cond == [{}, {3: [(1, 0.0)], 4: [(1, 0.0)]}, {1: [(2, 0.0)]}, {2: [(4, 0.0)]}]
    assert lat.chain() == [4, 1, 2, 4]


def test_counts_rank_candidates_and_parent_conditioning():
    # Only the 1-gram [1] matches (ends 0, 2, 4); 9 follows twice, 8 once.
    lat = drafted([1, 9, 1, 9, 1, 8, 1], m=8)
    assert lat.tokens[0] == [9, 8]
    assert lat.logp[0] == [math.log(2 / 3), math.log(1 / 3)]
    assert lat.cond[2] == {1: [(8, math.log(0.5)), (9, math.log(0.5))]}
    assert len(lat.tokens) == 6  # the oldest occurrence runs out of context after 6 positions
    assert drafted([1, 9, 1, 9, 1, 8, 1], k=1).tokens[0] == [9]


def test_no_match_gives_the_empty_lattice():
    assert drafted([1, 2, 3, 4]) == Lattice()
    assert drafted([5]).tokens == []
    # min_ngram = 2 ignores single-token matches.
    assert drafted([7, 1, 8, 1], min_n=2).tokens == []


def test_json_round_trip():
    lat = drafted([1, 9, 1, 9, 1, 8, 1])
    data = json.loads(json.dumps(lat.to_json()))
    assert data["cond"][0] == {} and "9" in data["cond"][1]
    assert Lattice.from_json(data) == lat


@settings(max_examples=300, deadline=None)
@given(
    context=st.lists(st.integers(0, 4), min_size=1, max_size=60),
    cuts=st.lists(st.integers(1, 60), max_size=4),
    m=st.integers(1, 8),
    k=st.integers(1, 4),
    max_n=st.integers(1, 5),
    min_n=st.integers(1, 5),
)
def test_incremental_index_equals_rescan(context, cuts, m, k, max_n, min_n):
    min_n = min(min_n, max_n)
    drafter = NgramDrafter(max_n, min_n)
    # Commit the context in pieces, drafting after each, as decoding does.
    bounds = sorted({c for c in cuts if c < len(context)} | {len(context)})
    drafter.reset(context[: bounds[0]])
    _check_drafts(drafter, reference(context[: bounds[0]], m, k, max_n, min_n), m, k)
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        drafter.extend(context[lo:hi])
        _check_drafts(drafter, reference(context[:hi], m, k, max_n, min_n), m, k)


def _check_drafts(drafter: NgramDrafter, ref: Lattice, m: int, k: int) -> None:
    assert drafter.draft(m, k) == ref
    # Without the parent-conditioned ranks: the same candidates; at k = 1, stock's chain.
    assert drafter.draft(m, k, cond=False) == Lattice(ref.tokens, ref.logp, [])
    assert drafter.draft(m, 1, cond=False).chain() == ref.chain()
