"""How a verify forward passes a tree through a model's recurrent layers.

A recurrence (GatedDeltaNet, Mamba) reads its inputs in sequence order. Fed a
flattened tree it folds siblings into each other's state: wrong by 3-5 in the
logits (DESIGN.md), silently. A chain is exact: the flattened chain *is* the
sequence. So the default strategy verifies linear trees and refuses the rest.
treespec registers the tree-aware GatedDeltaNet (treespec.verify.gdn_tree)
for ``gated_delta`` by default; ``ChainOnly`` stays for other recurrences.

The hook: a tree-aware layer (one that starts each node's state from its
parent's, and takes its conv window from its ancestors) registers a strategy
for its kind with :func:`register_recurrent`; adapters created afterwards ask
it instead, and it injects itself for the forward through ``inject``::

    class TreeGatedDelta:
        name = "tree GatedDeltaNet"
        def refusal(self, model, caches, tree): return None
        @contextmanager
        def inject(self, model, caches, tree): ...  # instance-level, restored

    register_recurrent("gated_delta", TreeGatedDelta())
"""

from contextlib import contextmanager
from typing import Optional, Protocol, Sequence

import mlx.nn as nn

from ..tree import DraftTree


class RecurrentStrategy(Protocol):
    name: str

    def refusal(self, model: nn.Module, caches: Sequence, tree: DraftTree) -> Optional[str]:
        """Why this tree cannot go through the recurrent layers, or None.
        Called before anything is written."""

    def inject(self, model: nn.Module, caches: Sequence, tree: DraftTree):
        """Context manager active around the verify forward."""


class ChainOnly:
    """A recurrence fed the flattened tree: exact for chains only."""

    def __init__(self, layer: str):
        self.layer = layer
        self.name = f"chain-only {layer}"

    def refusal(self, model, caches, tree) -> Optional[str]:
        if tree.is_linear():
            return None
        return (
            f"a branching tree through {self.layer} recurrent layers: the flattened "
            "tree would fold sibling branches into one recurrent state (silently "
            "wrong); only linear trees verify until a tree-aware recurrent layer is "
            "registered (treespec.verify.register_recurrent)"
        )

    @contextmanager
    def inject(self, model, caches, tree):
        yield


def _tree_gated_delta():
    from .gdn_tree import TreeGatedDelta

    return TreeGatedDelta()


# Factories, not instances: a strategy holds the per-node states of its
# adapter's last verify, so a target and its drafter must never share one.
_RECURRENT = {
    "gated_delta": _tree_gated_delta,
}


def register_recurrent(kind: str, strategy) -> None:
    """Make ``strategy`` handle every recurrent layer of ``kind`` in adapters
    created from now on (``adapter_for``). ``strategy`` is a zero-argument
    factory returning a fresh strategy per adapter, or a strategy object
    (then shared by every adapter: only for stateless strategies)."""
    _RECURRENT[kind] = strategy if not hasattr(strategy, "refusal") else (lambda: strategy)


def recurrent_strategy(kind: str) -> RecurrentStrategy:
    if kind not in _RECURRENT:
        raise KeyError(f"no recurrent strategy for {kind!r}; known: {sorted(_RECURRENT)}")
    return _RECURRENT[kind]()
