"""Tree layout on a CUDA device equals the CPU layout. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from specpilot.kernels.tree import best_first_tree, tree_mask, tree_positions

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

LATTICE = {
    "tokens": [[1, 2, 3], [4, 5, 6], [7, 8], [9]],
    "logp": [[-0.1, -1.0, -2.0], [-0.2, -0.5, -3.0], [-0.3, -0.4], [-0.1]],
    "cond": [{}, {"2": [[5, -0.01]]}, {}, {}],
}


@pytest.mark.parametrize("n", [0, 1, 5, 12, 64])
def test_cuda_layout_equals_cpu_layout(n: int) -> None:
    tree = best_first_tree(LATTICE, n)
    cuda = torch.device("cuda")
    mask, pos = tree_mask(tree, cuda), tree_positions(tree, 9, cuda)
    assert mask.is_cuda and pos.is_cuda
    assert torch.equal(mask.cpu(), tree_mask(tree))
    assert torch.equal(pos.cpu(), tree_positions(tree, 9))
