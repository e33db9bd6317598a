"""Drafters: each round they grow a DraftTree from a draft model.

Three shapes, one mechanism (``treespec.draft.base.Drafter``):
- ``ChainDrafter(block)``: a chain of ``block - 1`` greedy drafts (mlx-lm's).
- ``FixedTreeDrafter(branching)``: SpecInfer/Medusa style; the top-k
  children at each depth, k from a list of branching factors, or explicit
  parent lists.
- ``ConfidenceDrafter(budget, ...)``: EAGLE-2 style; expands the nodes with
  the highest cumulative draft log-probability and keeps the ``budget`` best.
"""

from typing import Optional

from .base import DeviceRound, DraftRound, Drafter, Round, logprobs_of, top_children, top_ids
from .chain import ChainDrafter
from .confidence import ConfidenceDrafter
from .fixed import FixedTreeDrafter, fixed_shape, shape_name

__all__ = ["ChainDrafter", "ConfidenceDrafter", "DeviceRound", "DraftRound", "Drafter",
           "FixedTreeDrafter", "Round", "fixed_shape", "logprobs_of", "make_drafter",
           "shape_name", "top_children", "top_ids"]


def make_drafter(mode: str, block: int = 4, branching=None, parents=None,
                 budget: Optional[int] = None, width: int = 4,
                 batch_levels: bool = False) -> Drafter:
    """The drafter of a decode's shape options (treespec.options checks them:
    ``batch_levels`` only with a fixed shape)."""
    if batch_levels and (mode != "tree" or (branching is None and parents is None)):
        raise ValueError("batch_levels: only a fixed tree (branching or parents) drafts "
                         "levels as batch rows")
    if mode == "chain":
        return ChainDrafter(block)
    if mode == "tree":
        if branching is not None or parents is not None:
            return FixedTreeDrafter(branching=branching, parents=parents,
                                    batch_levels=batch_levels)
        return ConfidenceDrafter(budget if budget is not None else block - 1, width=width)
    raise ValueError(f"no drafter for mode {mode!r}")
