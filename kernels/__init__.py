"""specpilot.kernels: the paper's mechanisms as kernels.

    specpilot.kernels.w12             the W12 weight format, its codec and Triton GEMM
    specpilot.kernels.certified_head  the certified INT8 LM head (exact argmax)
    tree (below)                      draft trees from a lattice and their accept length τ

Imports nothing else of SpecPilot; torch and Triton are imported by the parts that compute.
"""

from .tree import Lattice, Tree, accept_length, best_first_tree, chain, topk_tree, tree_mask, tree_positions

__all__ = ["Lattice", "Tree", "accept_length", "best_first_tree", "chain", "topk_tree", "tree_mask",
           "tree_positions"]  # fmt: skip
