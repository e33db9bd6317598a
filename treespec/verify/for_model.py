"""Which adapter a model gets: :func:`adapter_for`, the tree adapter, or
TreeRefused naming the structural reason; and for chain drafting, a model
refused only for what a tree needs gets a :class:`ChainAdapter`."""

from typing import Optional, Sequence

import mlx.core as mx
import mlx.nn as nn

from ..errors import TreeRefused
from ..models import model_type
from ..tree import DraftTree
from .adapter import TreeAdapter, Verified
from .row_invariant import KernelRowAdapter, RowAdapter
from .strategy import RecurrentStrategy
from .structure import Structure, cache_refusal, structure


class ChainAdapter(TreeAdapter):
    """A chain's verify for a model whose tree verify is refused for a
    reason of trees alone (RoPE applied by hand, positions or masks built
    from flattened indices: what a tree's scattered positions would break).
    A chain is mlx-lm's own chain verify, a plain multi-token forward with
    contiguous positions and the causal mask, and its commit trims the
    caches, as mlx-lm's speculative decoding does: nothing of the tree path
    runs, so a chain is never refused for what only a tree needs. A
    branching tree (or a chain sent through the tree path) is refused with
    the tree's reason, before anything is written."""

    def __init__(self, model: nn.Module, walks: Structure):
        super().__init__(model, walks.family, None, walks.found, walks)
        self.tree_refusal = walks.why

    def check_model(self) -> list:
        return []  # no rope is handed per-node positions on a chain's plain forward

    def verify_handle(self, tree: DraftTree, cache: Sequence, start: int = 0,
                      tokens: Optional[mx.array] = None,
                      inject: Optional[bool] = None) -> Verified:
        if isinstance(tree, DraftTree) and (inject or not tree.is_linear()):
            self._refuse(f"{self.tree_refusal}; only chains verify here, through mlx-lm's own "
                         "multi-token forward")
        return super().verify_handle(tree, cache, start, tokens, inject=False)


def adapter_for(model: nn.Module, recurrent: Optional[RecurrentStrategy] = None,
                chains: bool = False, rows: bool = False,
                kernels=False) -> TreeAdapter:
    """The tree-verify adapter for ``model``, or TreeRefused naming the
    family and the specific structural reason (treespec.verify.structure).
    ``recurrent`` overrides the recurrent strategy (see
    treespec.verify.strategy.register_recurrent). ``chains``: only chains
    will be verified (chain drafting), so a model refused for a reason of
    trees alone gets a :class:`ChainAdapter`; one whose caches cannot roll
    back (a recurrent or unknown cache) is refused still. ``rows``: the
    row-invariant verify (treespec.verify.row_invariant.RowAdapter), chains
    included; its refusals are its own (never a ChainAdapter). ``kernels``:
    that verify with its linear layers computed by the row kernels
    (treespec.verify.row_invariant.KernelRowAdapter; CUDA only): True for
    treespec.backend.row_kernels, or an object with its three functions
    (``available``, ``coverage``, ``linear_rows``) in their place."""
    rows = rows or kernels is not False
    walks = structure(model)
    if walks.why and chains and not rows and not walks.found.mixers and cache_refusal(model) == (None, False):
        return ChainAdapter(model, walks)
    if walks.why:
        raise TreeRefused(model_type(model), walks.why)
    kind = KernelRowAdapter if kernels else RowAdapter if rows else TreeAdapter
    adapter = kind(model, walks.family, recurrent, walks.found, walks)
    if kernels is not False and kernels is not True:
        adapter.kernels = kernels
    adapter.check_model()
    adapter.vocab()  # read off a forward here, once, not inside a round's verify
    return adapter
