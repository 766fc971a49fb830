"""A draft tree as the GDN kernels see it: parent pointers, root paths and the ancestor mask.

Nodes come in verification order (parents before children); parent -1 is the committed state (the
root: the last committed token's state). Node n's root path is its ancestors from the root down,
ending at n itself; a chain is the tree whose node n has parent n - 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

ROOT = -1


class GdnInputError(ValueError):
    """Input the GDN kernels cannot take (shape, dtype, tree); the text says what to fix."""


@dataclass(frozen=True)
class TreeLayout:
    parents: tuple[int, ...]
    depth: tuple[int, ...]  # 1-based: a child of the root has depth 1
    paths: tuple[tuple[int, ...], ...]  # node n's root path, root side first, ending at n

    @classmethod
    def of(cls, parents: Sequence[int]) -> TreeLayout:
        parents = tuple(int(p) for p in parents)
        if not parents:
            raise GdnInputError("the tree has no nodes; pass at least one parent index")
        depth: list[int] = []
        paths: list[tuple[int, ...]] = []
        for n, p in enumerate(parents):
            if not ROOT <= p < n:
                raise GdnInputError(
                    f"node {n} has parent {p}; a parent must be -1 (the committed state) or an earlier "
                    f"node (0..{n - 1}): list nodes parents first"
                )
            depth.append(1 if p == ROOT else depth[p] + 1)
            paths.append((n,) if p == ROOT else (*paths[p], n))
        return cls(parents, tuple(depth), tuple(paths))

    @classmethod
    def chain(cls, n: int) -> TreeLayout:
        return cls.of([i - 1 for i in range(n)])

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    def path_table(self, device=None) -> torch.Tensor:
        """[N, max_depth] int32: row n is node n's root path, padded with -1."""
        t = torch.full((len(self), self.max_depth), ROOT, dtype=torch.int32)
        for n, path in enumerate(self.paths):
            t[n, : len(path)] = torch.tensor(path, dtype=torch.int32)
        return t.to(device)

    def ancestors(self, device=None) -> torch.Tensor:
        """[N, N] bool: [i, j] is True where j is on i's root path (i itself included)."""
        a = torch.zeros(len(self), len(self), dtype=torch.bool)
        for i, path in enumerate(self.paths):
            a[i, list(path)] = True
        return a.to(device)
