"""Exact replay of τ for tree policies from recordings, without the target (paper §2.4, §4.2).

At greedy position i a policy builds its tree from lattices[i]; the accepted path is the longest
root path equal to greedy[i], greedy[i+1], ...; the step commits that path plus the bonus token
(τ = length + 1, cut at the end of the run) and the next step starts at i + τ. A run's τ is its
tokens over its steps, pooled over requests (the serve stats' T/S).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specpilot.kernels import Lattice, accept_length, best_first_tree, chain, topk_tree

from .recording import Record

BUDGETS = (8, 16, 32, 64)
TREE_POLICIES = ("chain", "best_first", "best_first_marginal", "topk")
ORACLE_TOP = 16
TOPK_WIDTH = 4

Acceptor = Callable[[Lattice, Sequence[int]], int]  # lattice, greedy[i:] -> accepted drafts


def oracle_accept(lattice: Lattice, target: Sequence[int], top: int = ORACLE_TOP) -> int:
    """Accepted drafts of the oracle: the number of leading draft positions d at which the target's
    greedy token target[d] is among the drafter's `top` best marginal candidates at d.

    This is the paper's oracle (§2.4): it "keeps accepting as long as the target's greedy token is
    within the drafter's top 16", i.e. a tree holding every top-16 path with no node budget. It
    bounds every tree drawn from the marginal candidates of an m-position lattice.
    """
    n = 0
    for d in range(min(lattice.positions, len(target))):
        if target[d] not in lattice.tokens[d][:top]:
            break
        n += 1
    return n


def topk_shape(budget: int, block_size: int) -> tuple[int, int]:
    """(k, depth) of the EAGLE-2-style tree for a node budget: width 4 (the paper's top-4 tree at
    16 nodes) and depth budget / 4; once that depth passes the block size, depth = block size and
    the width takes the rest of the budget. At most `budget` nodes."""
    if budget < TOPK_WIDTH:
        return max(budget, 1), 1
    depth = budget // TOPK_WIDTH
    if depth <= block_size:
        return TOPK_WIDTH, depth
    return budget // block_size, block_size


def acceptor(policy: str, budget: int | None, block_size: int) -> Acceptor:
    """The accepted-drafts function of a named policy at a node budget."""
    if policy == "oracle":
        return oracle_accept
    if budget is None:
        raise ValueError(f"policy {policy!r} needs a node budget")
    if policy == "chain":
        return lambda lat, tgt: accept_length(chain(lat, min(budget, block_size)), tgt)
    if policy == "best_first":
        return lambda lat, tgt: accept_length(best_first_tree(lat, budget, conditioned=True), tgt)
    if policy == "best_first_marginal":
        return lambda lat, tgt: accept_length(best_first_tree(lat, budget, conditioned=False), tgt)
    if policy == "topk":
        k, depth = topk_shape(budget, block_size)
        return lambda lat, tgt: accept_length(topk_tree(lat, k, depth), tgt)
    raise ValueError(f"unknown tree policy {policy!r}; known: {', '.join((*TREE_POLICIES, 'oracle'))}")


@dataclass
class Replay:
    """τ of one policy at one budget: pooled and per benchmark set."""

    policy: str
    budget: int | None
    tokens: int
    steps: int
    per_set: dict[str, float] = field(default_factory=dict)

    @property
    def tau(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


def replay_record(record: Record, accept: Acceptor) -> tuple[int, int]:
    """(tokens, steps) of one request under a policy."""
    greedy, i, steps = record.greedy, 0, 0
    while i < len(greedy):
        target = greedy[i:]
        drafted = accept(record.lattices[i], target)
        i += min(drafted + 1, len(target))
        steps += 1
    return len(greedy), steps


def replay(records: Sequence[Record], policy: str, budget: int | None) -> Replay:
    """τ of `policy` at `budget` over `records`."""
    block = max((r.block_size for r in records), default=0)
    accept = acceptor(policy, budget, block)
    by_set: dict[str, list[int]] = {}
    tokens = steps = 0
    for rec in records:
        t, s = replay_record(rec, accept)
        tokens, steps = tokens + t, steps + s
        acc = by_set.setdefault(rec.set, [0, 0])
        acc[0], acc[1] = acc[0] + t, acc[1] + s
    per_set = {name: t / s for name, (t, s) in sorted(by_set.items()) if s}
    return Replay(policy, None if policy == "oracle" else budget, tokens, steps, per_set)


@dataclass
class ReplayTable:
    """τ per tree policy and node budget, and the oracle."""

    budgets: list[int]
    results: list[Replay]
    requests: int
    block_size: int
    set_sizes: dict[str, int] = field(default_factory=dict)  # requests per benchmark set

    def tau(self, policy: str, budget: int | None) -> float:
        for r in self.results:
            if r.policy == policy and r.budget == (None if policy == "oracle" else budget):
                return r.tau
        raise KeyError(f"no replay of {policy!r} at budget {budget}")

    def best_tree(self, budget: int) -> tuple[str, float]:
        """The tree policy (oracle excluded) with the highest τ at `budget`."""
        cands = [(r.tau, r.policy) for r in self.results if r.budget == budget and r.policy in TREE_POLICIES]
        if not cands:
            raise KeyError(f"no tree replayed at budget {budget} (have {self.budgets})")
        tau, policy = max(cands, key=lambda c: (c[0], -TREE_POLICIES.index(c[1])))
        return policy, tau

    def to_dict(self) -> dict:
        return {
            "budgets": self.budgets,
            "requests": self.requests,
            "set_sizes": self.set_sizes,
            "block_size": self.block_size,
            "tau": {p: {str(b): self.tau(p, b) for b in self.budgets} for p in TREE_POLICIES}
            | {"oracle": self.tau("oracle", None)},
            "per_set": {
                f"{r.policy}@{r.budget if r.budget is not None else 'all'}": r.per_set for r in self.results
            },
            "topk_shapes": {str(b): list(topk_shape(b, self.block_size)) for b in self.budgets},
        }


def replay_table(records: Sequence[Record], budgets: Sequence[int] = BUDGETS) -> ReplayTable:
    """Replay every tree policy at every budget, and the oracle."""
    results = [replay(records, p, b) for p in TREE_POLICIES for b in budgets]
    results.append(replay(records, "oracle", None))
    block = max((r.block_size for r in records), default=0)
    sizes: dict[str, int] = {}
    for rec in records:
        sizes[rec.set] = sizes.get(rec.set, 0) + 1
    return ReplayTable(list(budgets), results, len(records), block, dict(sorted(sizes.items())))
