"""The row-invariant verify: a tree (or chain) verified in one forward in
which every piece hands each node's row what a one-token step at that node
computes, where the backend keeps rows of a batched call invariant.

:class:`RowAdapter` is a :class:`~treespec.verify.adapter.TreeAdapter` whose
attentions run depth by depth (treespec.verify.depth_steps: one query per
node over exactly its history and root path, the projections once over all
nodes); everything else is the tree path's (per-node RoPE positions, the
tree-aware recurrence on hybrids, for chains too, the row-by-row norms and
MLP over the T nodes). Chains go through it too: mlx-lm's chain verify
attends with one causal call over the T queries, which is what a backend's
attention kernel tiles by T.

Whether its rows are then bit-identical to single steps is the backend's
(a linear's rows at width T, an attention's rows on the batch axis: the
census measures both, treespec.backend.census), and the gate measures the
verify itself: nothing here is declared exact. Refused, before anything is
written, with the reason: caches other than mlx-lm's plain ``KVCache`` (the
keys are gathered per node from the cache's buffer), latent attentions and
per-position values (their own per-node paths), a tree fed in parts.
"""

from contextlib import contextmanager
from typing import Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from .. import caches
from ..backend import row_kernels
from ..mixers import set_slot, slots
from ..tree import DraftTree
from .adapter import TreeAdapter, Verified
from .attention import Sites, tree_injected
from .depth_steps import (DepthSteps, KernelLinear, KeptRoPE, Layout, Projection, depth_groups,
                          projections)
from .tree_recurrence import TreeRecurrence

# what the row kernels may stand in for (an embedding: its as_linear, a tied head)
_LINEARS = (nn.Linear, nn.QuantizedLinear, nn.Embedding, nn.QuantizedEmbedding)

__all__ = ["CHUNK_ROW_ADAPTER", "KERNEL_ROW_ADAPTER", "KernelLinears", "KernelRowAdapter",
           "MEMO_NAMES", "ROW_ADAPTER", "RowAdapter", "StandIns", "chunks_name"]

# The gate's memo names an adapter; these three's verdicts are their own.
ROW_ADAPTER = "treespec.verify.row_invariant"
KERNEL_ROW_ADAPTER = "treespec.verify.row_invariant+kernels"
CHUNK_ROW_ADAPTER = "treespec.verify.row_invariant+chunks"  # and " of W": chunks_name
# --verify's modes other than flat, and the memo name of each one's verdicts (chunks: per
# width, chunks_name; never this width-less name)
MEMO_NAMES = {"rows": ROW_ADAPTER, "kernels": KERNEL_ROW_ADAPTER}


def chunks_name(width: int) -> str:
    """The memo name of the verify with its linears in calls of ``width``
    rows (treespec.backend.row_chunks): one verdict per width."""
    return f"{CHUNK_ROW_ADAPTER} of {width}"


class RowAdapter(TreeAdapter):
    """A tree adapter whose verify is row-invariant (module docstring)."""

    def __init__(self, model, family, recurrent=None, found=None, walks=None):
        super().__init__(model, family, recurrent, found, walks)
        self._stand_ins = StandIns()  # made on the first verify (StandIns)
        # A chain through mlx-lm's multi-token recurrence (one conv1d, one
        # gated-delta or ssm_update call over its T nodes, the state carried
        # inside) gives later nodes a T-token call's bits, which the census's
        # "steps" rows measure and the row width does not read (mamba2's
        # ssm_update differs from 2 on every backend measured). Every node
        # takes its own one-token step here, chains included: the default
        # tree-aware recurrence with chains=True (a caller's strategy is kept).
        if recurrent is None and isinstance(self.recurrent, TreeRecurrence):
            self.recurrent.chains = True

    def _checked(self, tree: DraftTree, cache: Sequence, start: int, ropes: bool):
        if self._one_token:
            self._refuse("its latent attentions take a one-token path of their own "
                         "(treespec.verify.per_node); the row-invariant verify does not run them")
        if self.family.positions:
            self._refuse("it computes per-position values itself; the row-invariant verify "
                         "runs attention by depth and cannot re-index them")
        if start:
            self._refuse(f"a tree fed in parts (start={start}): the row-invariant verify "
                         "takes a tree whole")
        for _, c in caches.leaves(cache):
            if not caches.mode_of(c).recurrent and type(c) is not KVCache:
                self._refuse(f"cache {type(c).__name__}: the row-invariant verify gathers each "
                             "node's keys from a plain KVCache's buffer (no quantized, rotating "
                             "or chunked cache)")
        return super()._checked(tree, cache, start, ropes)

    def verify_handle(self, tree: DraftTree, cache: Sequence, start: int = 0,
                      tokens: Optional[mx.array] = None,
                      inject: Optional[bool] = None) -> Verified:
        # A chain too: mlx-lm's chain verify is one causal attention call.
        return super().verify_handle(tree, cache, start, tokens,
                                     inject=isinstance(tree, DraftTree) and len(tree) > 1)

    def depth_groups(self, tree: DraftTree) -> list:
        """Per depth, (nodes, their root paths): treespec.verify.depth_steps.
        depth_groups of the tree (the seam the suites plant key defects in)."""
        return tree.derived("depth_groups", lambda: depth_groups(tree.depths(), tree.ancestry()))

    def injection(self, cache: Sequence, tree: DraftTree, owners: list, start: int,
                  plans: Optional[dict] = None, ropes: bool = True):
        return _by_depth(self.model, cache, tree, owners, self.family.rope_attr, self.rope_pool,
                         self.depth_groups(tree), self._stand_ins)


class KernelRowAdapter(RowAdapter):
    """The row-invariant verify with every linear layer the row kernels cover
    (treespec.backend.row_kernels: MLX's one-row kernels' order for every
    row, the weights read once) computed by them, the rest as
    :class:`RowAdapter` runs it. CUDA only; elsewhere refused, naming why."""

    # The kernels' module (available, coverage, linear_rows); a suite's
    # stand-in exercises this seam on a backend without CUDA.
    kernels = row_kernels

    def __init__(self, model, family, recurrent=None, found=None, walks=None):
        super().__init__(model, family, recurrent, found, walks)
        self._linears = KernelLinears()

    def check_model(self):
        if not self.kernels.available():
            self._refuse(f"the row kernels are CUDA kernels and this process computes on "
                         f"{mx.default_device()} (--verify rows runs without them)")
        return super().check_model()

    def covered(self) -> list:
        """``(path, why)`` of every linear layer the kernels leave to MLX."""
        return [(path, why) for path, _, _, m in slots(self.model) if isinstance(m, _LINEARS)
                for why in [self.kernels.coverage(m)] if why]

    @contextmanager
    def injection(self, cache: Sequence, tree: DraftTree, owners: list, start: int,
                  plans: Optional[dict] = None, ropes: bool = True):
        put = []
        try:
            for container, key, module, stand_in in self._linears.current(self.model, self.kernels):
                set_slot(container, key, stand_in)
                put.append((container, key, module))
            with super().injection(cache, tree, owners, start, plans, ropes) as probe:
                yield probe
        finally:
            for container, key, module in reversed(put):
                set_slot(container, key, module)


def _held(container, key, module) -> bool:
    """Whether a slot (treespec.mixers.slots) still holds ``module``."""
    return container is not None and container[key] is module


class KernelLinears:
    """One model's :class:`KernelLinear` stand-ins, one per linear the
    kernels cover, made on its first verify and reused by the next while
    every slot still holds the linear it was made for and the kernels are
    the same (a model changed in between gets new ones). Reused, they also
    keep :class:`StandIns` reusable (its projections are these). Made per
    forward, walking the model's slots and making these (and so the
    attentions' stand-ins) again cost an H100's host 5.5-9.4 ms of a
    32-layer verify's graph (results/exact-at-speed/README.md#where-the-exact-modes-host-time-went-on-an-h100)."""

    def __init__(self):
        self.kernels = None
        self.sites: Optional[list] = None  # (container, key, linear, its KernelLinear)

    def current(self, model, kernels) -> list:
        if (self.sites is None or kernels is not self.kernels
                or not all(_held(c, k, m) for c, k, m, _ in self.sites)):
            self.kernels = kernels
            self.sites = [(c, k, m, KernelLinear(m, kernels.linear_rows))
                          for _, c, k, m in slots(model)
                          if isinstance(m, _LINEARS) and kernels.coverage(m) is None]
        return self.sites


class StandIns:
    """One model's row-invariant stand-ins, made on its first verify and
    reused by the next while every slot still holds the module they were
    made for (each forward restores them; a model changed in between, or
    the row kernels' fresh linears, get new ones). Made per forward they
    cost the host about 2 ms of a 32-layer verify's graph, which the GPU
    waits for (results/exact-at-speed/README.md#the-bench-at-alpha-002-with-the-cheaper-row-invariant-verify-3f309e9)."""

    def __init__(self):
        self.wanted: frozenset = frozenset()
        # (container, key, attention, its DepthSteps, [(container, key, child, stand-in)]: its
        # linears' Projections and its rope's KeptRoPE)
        self.sites: list = []

    def current(self, model, wanted: frozenset, depths: mx.array, layout: Layout,
                rope_attr: str) -> list:
        if wanted != self.wanted or not all(
                _held(c, k, m) and all(_held(pc, pk, child) for pc, pk, child, _ in ps)
                for c, k, m, _, ps in self.sites):
            self.wanted, self.sites = wanted, []
            for _, container, key, module in slots(model):
                if id(module) in wanted:
                    ps = [(c, k, lin, Projection(lin)) for _, c, k, lin in projections(module)]
                    ropes = ([(module, rope_attr, module[rope_attr], KeptRoPE(module[rope_attr]))]
                             if rope_attr in module else [])
                    stand_in = DepthSteps(module, depths, layout, [p for *_, p in ps],
                                          [r for *_, r in ropes])
                    # (container, key, child, its stand-in): projections and rope alike
                    self.sites.append((container, key, module, stand_in, ps + ropes))
        for *_, stand_in, _ in self.sites:
            stand_in.rebind(depths, layout)
        return self.sites


@contextmanager
def _by_depth(model, cache, tree: DraftTree, owners: list, rope_attr: str, rope_pool: dict,
              groups: list, stand_ins: StandIns):
    """Every rope owner's attention a :class:`DepthSteps` for one forward
    (its linears :class:`Projection` stand-ins: ``stand_ins``' own), the
    tree's masks on the caches as every verify has them; restored in a
    ``finally``. Yields the probe of :func:`tree_injected`, which also raises
    when an attention was never reached."""
    depths = tree.derived(("depths", 0), lambda: mx.array(tree.depths(), dtype=mx.int32))
    layout = Layout(groups)
    wanted = frozenset(id(owner) for _, owner in owners)
    put = []  # (container, key, module): restored in reverse
    steps = []
    try:
        for container, key, module, stand_in, ps in stand_ins.current(model, wanted, depths, layout,
                                                                     rope_attr):
            for c, k, child, p in ps:
                set_slot(c, k, p)
                put.append((c, k, child))
            set_slot(container, key, stand_in)
            put.append((container, key, module))
            steps.append(stand_in)
        sites = Sites(rope_attr, [], [], (), rope_pool)
        with tree_injected(model, cache, tree, sites) as probe:
            def checked():
                probe()
                missed = len([s for s in steps if s._calls == 0])
                if missed:
                    raise RuntimeError(f"row-invariant verify bypassed: {missed} attention(s) "
                                       "never called")

            yield checked
    finally:
        for container, key, module in reversed(put):
            set_slot(container, key, module)
