"""Batching rules over draft trees (paper §4.4): how many verification rows each request of a step gets.

When many requests share a verification step, every row costs real time, so the rows a step can
afford are a budget to spend across the batch. `shared_budget_trees` fills one node budget
best-first across all the requests' candidate trees: a node of one request outranks a node of
another when its path score Σ log p(child | parent) is higher, so requests whose drafter is
confident get deep trees and the rest get few nodes. Each request's tree stays prefix-closed (a
child never outscores its parent), and with one request it is `best_first_tree`.

Pure python, like `tree.py`: the cost model replays it on recordings.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from .tree import ROOT, Lattice, Tree


def shared_budget_trees(lattices: Sequence[Any], total: int, conditioned: bool = True) -> list[Tree]:
    """One tree per lattice, together the `total` nodes of highest path score over all of them.

    Edges are scored as in `best_first_tree`; ties go to the node pushed first (earlier request,
    then better rank, then shallower). Fewer nodes come back only when the candidate trees hold fewer.
    """
    if total < 0:
        raise ValueError(f"the node budget must be >= 0, got {total}")
    lats = [Lattice.coerce(lat) for lat in lattices]
    trees = [Tree() for _ in lats]
    heap: list[
        tuple[float, int, int, int, int, int]
    ] = []  # (-score, seq, request, position d, token, parent)
    seq = 0
    for r, lat in enumerate(lats):
        for tok, lp in lat.candidates(0, None, conditioned):
            heap.append((-lp, seq, r, 0, tok, ROOT))
            seq += 1
    heapq.heapify(heap)
    placed = 0
    while heap and placed < total:
        neg, _, r, d, tok, parent = heapq.heappop(heap)
        node = trees[r].add(tok, parent, -neg)
        placed += 1
        for ctok, lp in lats[r].candidates(d + 1, tok, conditioned):
            heapq.heappush(heap, (neg - lp, seq, r, d + 1, ctok, node))
            seq += 1
    return trees
