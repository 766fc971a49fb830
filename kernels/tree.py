"""Draft trees built from a drafter's candidate lattice (CONTRACTS §3, §9; paper §4.2).

A lattice holds, for each of the m draft positions, the drafter's top-k candidate tokens with their
log-probabilities (`tokens`, `logp`), and optionally parent-conditioned scores (`cond[d][parent]`:
the candidates at position d given the token at d-1). A tree is a set of draft nodes verified in
one target pass; the root is the last committed token. Nodes are prefix-closed and every parent
precedes its children, so the tree can be laid out as verification rows in node order.

Pure python (no SpecPilot imports): the tree-verification entry carries a copy of it (kept
identical by a test), and the cost model replays τ with it. `tree_mask` and `tree_positions` lay a
tree out as one verification pass (root row 0, node i at row i + 1) and import torch only when
called, so replay stays torch-free.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ROOT = -1  # parent index of depth-1 nodes: the last committed token


@dataclass
class Lattice:
    """The drafter's output for one draft step; `cond[0]` is always empty."""

    tokens: list[list[int]]
    logp: list[list[float]]
    cond: list[dict[int, list[tuple[int, float]]]] = field(default_factory=list)

    @classmethod
    def coerce(cls, lattice: Any) -> Lattice:
        """A Lattice from any object with .tokens/.logp/.cond or from the JSON form (a dict)."""
        if isinstance(lattice, Lattice):
            return lattice
        if isinstance(lattice, Mapping):
            tokens, logp, cond = lattice.get("tokens", []), lattice.get("logp", []), lattice.get("cond", [])
        else:
            tokens, logp, cond = lattice.tokens, lattice.logp, getattr(lattice, "cond", None) or []
        if len(tokens) != len(logp) or any(len(t) != len(p) for t, p in zip(tokens, logp, strict=True)):
            raise ValueError("lattice: `tokens` and `logp` must have the same shape [m][k]")
        norm_cond = [
            {int(parent): [(int(t), float(s)) for t, s in cands] for parent, cands in level.items()}
            for level in cond
        ]
        return cls(
            tokens=[[int(t) for t in row] for row in tokens],
            logp=[[float(s) for s in row] for row in logp],
            cond=norm_cond,
        )

    def to_json(self) -> dict:
        """The JSON form of CONTRACTS §3 (cond keys become strings)."""
        return {
            "tokens": self.tokens,
            "logp": self.logp,
            "cond": [{str(p): [list(c) for c in cands] for p, cands in level.items()} for level in self.cond],
        }

    @property
    def positions(self) -> int:
        """Draft positions that hold at least one candidate (positions past the first empty one don't count)."""
        for d, row in enumerate(self.tokens):
            if not row:
                return d
        return len(self.tokens)

    def candidates(self, d: int, parent: int | None, conditioned: bool) -> list[tuple[int, float]]:
        """(token, edge log-prob) at draft position d below a node holding `parent` (None: the root).

        Conditioned: cond[d][parent] when the parent's token has an entry there, else the marginal
        candidates. Duplicate tokens keep their first (best) entry, so siblings are distinct.
        """
        if d >= self.positions:
            return []
        cands: Sequence[tuple[int, float]] | None = None
        if conditioned and parent is not None and d < len(self.cond):
            cands = self.cond[d].get(parent)
        if cands is None:
            cands = list(zip(self.tokens[d], self.logp[d], strict=True))
        seen: set[int] = set()
        out = []
        for tok, lp in cands:
            if tok not in seen:
                seen.add(tok)
                out.append((tok, lp))
        return out


@dataclass
class Tree:
    """Draft nodes in verification order: parents precede children, the set is prefix-closed."""

    tokens: list[int] = field(default_factory=list)  # node i's token
    parents: list[int] = field(default_factory=list)  # parent node index; -1 = child of the root
    depths: list[int] = field(default_factory=list)  # 1-based depth (= draft position d + 1)
    scores: list[float] = field(default_factory=list)  # path score: sum of edge log-probs to the root

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int, score: float) -> int:
        """Append a node under `parent` (an earlier node or ROOT); returns its index."""
        if parent != ROOT and not 0 <= parent < len(self.tokens):
            raise ValueError(f"parent {parent} must be ROOT or an earlier node (have {len(self.tokens)})")
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(1 if parent == ROOT else self.depths[parent] + 1)
        self.scores.append(score)
        return len(self.tokens) - 1

    def path(self, i: int) -> list[int]:
        """Tokens on the root path ending at node i (root excluded)."""
        out = []
        while i != ROOT:
            out.append(self.tokens[i])
            i = self.parents[i]
        return out[::-1]


def chain(lattice: Any, length: int | None = None) -> Tree:
    """Stock: the drafter's top-1 candidate at each position, up to `length` positions (default all)."""
    lat = Lattice.coerce(lattice)
    n = lat.positions if length is None else min(length, lat.positions)
    tree, score = Tree(), 0.0
    for d in range(n):
        score += lat.logp[d][0]
        tree.add(lat.tokens[d][0], d - 1 if d else ROOT, score)
    return tree


def best_first_tree(lattice: Any, n_nodes: int, conditioned: bool = True) -> Tree:
    """The n_nodes nodes of highest path score Σ log p(child | parent), prefix-closed (paper §4.2).

    With `conditioned`, an edge below a parent holding token p at position d-1 is scored by
    cond[d][p] when the lattice has that entry, else by the marginal logp[d] (DDTree's marginal
    tree is `conditioned=False`). Edge scores are log-probabilities (<= 0), so a child never
    outscores its parent: taking nodes off a max-heap in score order yields the top-n set of the
    whole candidate tree, and that set is prefix-closed. Ties go to the node pushed first (better
    rank, then shallower). Fewer nodes come back only when the candidate tree has fewer.
    """
    lat = Lattice.coerce(lattice)
    tree = Tree()
    heap: list[tuple[float, int, int, int, int]] = []  # (-score, seq, position d, token, parent)
    seq = 0
    for tok, lp in lat.candidates(0, None, conditioned):
        heap.append((-lp, seq, 0, tok, ROOT))
        seq += 1
    heapq.heapify(heap)
    while heap and len(tree) < n_nodes:
        neg, _, d, tok, parent = heapq.heappop(heap)
        node = tree.add(tok, parent, -neg)
        for ctok, lp in lat.candidates(d + 1, tok, conditioned):
            heapq.heappush(heap, (neg - lp, seq, d + 1, ctok, node))
            seq += 1
    return tree


def topk_tree(lattice: Any, k: int, depth: int, conditioned: bool = True) -> Tree:
    """EAGLE-2-style tree: k nodes per layer for `depth` layers (at most k × depth nodes).

    Layer 1 is the root's k best candidates; layer l+1 is the k children of highest path score
    among the top-k children of each layer-l node (EAGLE-2's expansion phase; its final rerank is
    the best-first rule of `best_first_tree`). Edges are scored as in `best_first_tree`.
    """
    lat = Lattice.coerce(lattice)

    def top(d: int, parent: int | None) -> list[tuple[int, float]]:
        # Stable sort: equal scores keep the lattice's order.
        return sorted(lat.candidates(d, parent, conditioned), key=lambda c: -c[1])[:k]

    tree = Tree()
    layer = [(lp, tok, ROOT) for tok, lp in top(0, None)]
    for d in range(depth):
        if not layer:
            break
        nodes = [(tree.add(tok, parent, score), tok, score) for score, tok, parent in layer]
        if d + 1 == depth:
            break
        children = [(score + lp, ctok, node) for node, tok, score in nodes for ctok, lp in top(d + 1, tok)]
        layer = sorted(children, key=lambda c: -c[0])[:k]  # ties: better-ranked parent first
    return tree


def accept_length(tree: Tree, target: Sequence[int]) -> int:
    """Length of the longest root path whose tokens equal target[0], target[1], ... (bonus excluded)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for i, (tok, parent) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
        children.setdefault(parent, []).append((tok, i))
    frontier, n = [ROOT], 0
    # A set of matching nodes per depth: correct even if siblings repeat a token.
    while n < len(target):
        frontier = [i for p in frontier for tok, i in children.get(p, ()) if tok == target[n]]
        if not frontier:
            break
        n += 1
    return n


def tree_mask(tree: Tree, device: Any = None) -> torch.Tensor:
    """Ancestor-only attention among the verification rows: bool [n + 1, n + 1], True where row r
    may attend row c.

    Row 0 is the root (the last committed token), row i + 1 is node i. Each row sees itself, the
    root and its ancestors, never a sibling's branch, so each node's logits are those of its own
    root path. The caller prepends the committed prefix's slots (all True). Parents precede
    children, so a node's row is its parent's row plus itself: built on the host (one numpy row
    copy per node, ~10x faster than per-level torch ops at these sizes) and moved to `device` in
    one copy.
    """
    import numpy as np
    import torch

    n = len(tree) + 1
    mask = np.zeros((n, n), dtype=np.bool_)
    mask[0, 0] = True
    for i, parent in enumerate(tree.parents):
        mask[i + 1] = mask[parent + 1]
        mask[i + 1, i + 1] = True
    return torch.from_numpy(mask).to(device)


def tree_positions(tree: Tree, start: int, device: Any = None) -> torch.Tensor:
    """RoPE positions of the verification rows: long [n + 1], the root at `start`, node i at
    start + depth (siblings share a position, as they are alternatives for the same token)."""
    import torch

    return torch.tensor([start, *(start + d for d in tree.depths)], dtype=torch.long, device=device)
