"""How a verify forward passes a tree through a model's recurrent layers.

A recurrence (GatedDeltaNet, Mamba) reads its inputs in sequence order. Fed a
flattened tree it folds siblings into each other's state: wrong by 3-5 in the
logits, silently. A chain is exact: the flattened chain *is* the sequence.
:class:`ChainOnly` verifies linear trees and refuses the rest; the default,
registered for every model with a recurrent cache (kind ``"tree"``), is the
tree-aware recurrence of treespec.verify.tree_recurrence, which runs every mixer
per depth.

Another strategy registers a factory for its kind with
:func:`register_recurrent`; adapters created afterwards ask it, and it
injects itself for the forward through ``inject``.
"""

from contextlib import contextmanager
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import mlx.nn as nn

from ..tree import DraftTree
from .tree_recurrence import TreeRecurrence


class RecurrentStrategy(Protocol):
    """What the adapter asks of a recurrence, for branching trees (a chain
    is always a plain forward through the mixer's own multi-token path, and
    its commit replays the accepted prefix)."""

    name: str

    def refusal(self, model: nn.Module, caches: Sequence, tree: DraftTree) -> Optional[str]:
        """Why this tree cannot go through the recurrent layers, or None.
        Called before anything is written."""

    def inject(self, model: nn.Module, caches: Sequence, tree: DraftTree):
        """Context manager active around the verify forward of a branching
        tree; instance-level changes only, restored on exit."""

    def kept_states(self) -> List[Tuple[object, object]]:
        """``(cache entry, KeptStates)`` (treespec.rollback.KeptStates) for
        every layer whose per-node states the last ``inject`` kept; handed
        over once. Empty when the strategy keeps none (commit replays)."""


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

    def kept_states(self) -> list:
        return []


# Factories, not instances: a strategy holds the per-node states of its
# adapter's last verify, so a target and its drafter must never share one.
TREE = "tree"
_RECURRENT: Dict[str, Callable[[], RecurrentStrategy]] = {
    TREE: TreeRecurrence,
}


def register_recurrent(kind: str, factory: Callable[[], RecurrentStrategy]) -> None:
    """Make adapters created from now on handle every recurrent layer of
    ``kind`` with ``factory()``: a zero-argument callable returning a fresh
    strategy per adapter."""
    if not callable(factory) or (not isinstance(factory, type) and hasattr(factory, "refusal")):
        raise TypeError("register_recurrent takes a factory (a zero-argument callable "
                        "returning a fresh strategy), not a strategy object: a strategy "
                        "holds its adapter's last verify and must not be shared")
    _RECURRENT[kind] = factory


def recurrent_strategy(kind: str) -> RecurrentStrategy:
    if kind not in _RECURRENT:
        raise KeyError(f"no recurrent strategy for {kind!r}; known: {sorted(_RECURRENT)}")
    return _RECURRENT[kind]()
