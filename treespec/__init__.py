"""treespec: tree speculative decoding on mlx-lm, and the suite that proves it exact."""

from .tree import DraftTree, TreeError
from .walk import Walk, chain_walk, tree_walk

__all__ = ["DraftTree", "TreeError", "Walk", "chain_walk", "tree_walk"]
