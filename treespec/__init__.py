"""treespec: tree speculative decoding on mlx-lm, and the suite that proves it exact.

The entry point is :func:`treespec.decode` (classic, chain or tree decoding,
greedy or sampled). It is exported lazily: ``import treespec`` (and so
``treespec --help``, whose flags are parsed before anything heavy loads) does
not import mlx-lm; the first use of ``treespec.decode`` does (it lives in
treespec/decoding.py: a module named ``decode`` would shadow the function). The layering
check counts :data:`EXPORTS` as imports of this package, as it counts the
command line's ``COMMANDS`` table.
"""

import importlib

from .tree import DraftTree, TreeError
from .walk import Walk, chain_walk, tree_walk

# name -> "module:attribute", imported on first use.
EXPORTS = {
    "decode": "treespec.decoding:decode",
    "detokenize": "treespec.decoding:detokenize",
}

__all__ = ["DraftTree", "TreeError", "Walk", "chain_walk", "tree_walk", *EXPORTS]


def __getattr__(name):
    if name not in EXPORTS:
        raise AttributeError(f"module 'treespec' has no attribute {name!r}")
    module, _, attr = EXPORTS[name].partition(":")
    return getattr(importlib.import_module(module), attr)
