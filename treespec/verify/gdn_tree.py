"""Tree-aware gated-delta recurrence for hybrid mlx-lm models.

A GatedDeltaNet-style mixer carries two kinds of state in its ``ArraysCache``:
causal-conv windows (the last ``K-1`` conv inputs) and a recurrent matrix
state. Running the mixer over a flattened tree is wrong: a node would inherit
its flattened predecessor's state (a sibling, or a cousin's leaf) instead of
its parent's, and its conv window would mix in those neighbours' inputs.

Here every node starts from its PARENT's state. The root starts from the
cached state. Nodes of one depth are independent of each other, so they run
as one batch: the unmodified mixer is called once per depth with inputs
``[n_d, 1, D]`` and a scratch ``ArraysCache`` whose slots hold the parents'
states gathered along the batch axis. Its own projections, conv, q/k
normalisation, ``gated_delta_update``, norm and output projection do all the
math. A tree of depth ``d`` costs ``d + 1`` mixer calls whatever its width.
Calling the real module, rather than a copy of its math, is also what keeps
this bit-identical to a plain forward over each node's root path on the CPU
backend: every op sees the same values in the same per-row order.

Every node's state after its step is kept, per depth level, stacked over the
nodes of that level (:class:`TreeStates`). Committing the accepted node is
then a gather: its conv windows and recurrent state become the cache entries,
with no replay. The price is memory (treespec.verify.footprint), so trees
whose per-node states exceed a limit are refused before anything runs.

    tree_mixer_forward(mixer, x, tree, cache) -> (out [1, n, D], TreeStates)
    TreeGatedDeltaNet(mixer, tree)            same call as the mixer; .states
    TreeStates.write(cache_entry, node)       cache := node's states, advance(depth+1)
    tree_recurrence(model, tree, cache, limit) context manager -> {layer: stand-in}
    TreeGatedDelta(limit)                     the RecurrentStrategy the adapter uses
"""

import os
from contextlib import contextmanager
from typing import Any, List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import ArraysCache

from ..errors import TreeRefused
from .footprint import footprint_refusal
from .mixers import StandIn, _family, _slots_fn, is_gated_delta_mixer, recurrent_mixers


# --------------------------------------------------------------------------
# Modes that are refused, by name.

KERNEL_ENV = "TREESPEC_GDN_KERNEL"


def _kernel_path(module) -> bool:
    """Whether ``gated_delta_update`` (or kimi_k3's compiled decode step)
    would take the Metal kernel for this module. CUDA has no gated-delta
    kernel in mlx-lm 0.32: it runs the same ops loop as the CPU."""
    return (
        not module.training
        and mx.default_device() == mx.gpu
        and mx.metal.is_available()
    )


def backend_refusal(module) -> Optional[str]:
    """The Metal kernel path is refused unless ``TREESPEC_GDN_KERNEL=allow``.

    Each kernel call here would see T=1 per batch row, started from the
    parent's state (never a flattened tree), and the kernel's per-step
    arithmetic does not depend on T, so the recurrence should match; but it
    has not been measured on Apple GPUs, so by default it is refused."""
    if _kernel_path(module) and os.environ.get(KERNEL_ENV, "refuse") != "allow":
        return (
            f"{type(module).__name__}: gated_delta_update would run its Metal "
            "kernel, whose per-depth batched use is not verified for exactness. "
            f"Set {KERNEL_ENV}=allow to run it anyway (one T=1 kernel call per "
            "depth, never a flattened tree; measure it with the gate), or run on "
            "the CPU stream"
        )
    return None


def cache_refusal(cache) -> Optional[str]:
    """The tree verify is single-sequence. A right-padded batch (``lengths``)
    or left padding not yet consumed would mask tree nodes away."""
    if cache is None:
        return None
    if not isinstance(cache, ArraysCache):
        return f"the tree-aware recurrence needs an ArraysCache, got {type(cache).__name__}"
    if cache.lengths is not None:
        return (
            "ArraysCache.lengths is set (a right-padded batch being prefilled); "
            "call cache.finalize() first"
        )
    bs = cache.batch_size
    if bs != 1:
        return f"the tree-aware recurrence needs batch size 1, the ArraysCache holds {bs}"
    lp = cache.left_padding
    if lp is not None and int(mx.max(lp).item()) > 0:
        return (
            f"ArraysCache.left_padding still masks {int(mx.max(lp).item())} "
            "positions of the next forward"
        )
    return None


def _check(module, cache) -> None:
    why = cache_refusal(cache) or backend_refusal(module)
    if why:
        raise TreeRefused(_family(module), why)


# --------------------------------------------------------------------------
# The per-depth forward.


class TreeStates:
    """Per-node cache slots of one mixer after a tree forward.

    ``levels[d]`` holds the slots of depth ``d``'s nodes, stacked along axis 0
    in node order; ``row[i]`` is node i's row in its level."""

    def __init__(self, depths: np.ndarray, levels: List[List[mx.array]], rows: np.ndarray):
        self.depths = depths
        self.levels = levels
        self.rows = rows

    def __len__(self) -> int:
        return len(self.depths)

    def node(self, i: int) -> List[mx.array]:
        """Node i's cache slots, each with a batch axis of 1."""
        if not 0 <= i < len(self.depths):
            raise IndexError(f"node {i} is not in a tree of {len(self.depths)} nodes")
        r = int(self.rows[i])
        return [s[r : r + 1] for s in self.levels[int(self.depths[i])]]

    def arrays(self) -> List[mx.array]:
        return [s for level in self.levels for s in level]

    def write(self, cache_entry: ArraysCache, node: int) -> None:
        """Make ``cache_entry`` what a plain forward over ``node``'s root path
        would have left: that node's conv windows and recurrent state, and
        the bookkeeping advanced by the path length. No replay."""
        slots = self.node(node)  # validates node before anything is written
        if len(slots) != len(cache_entry.cache):
            raise ValueError(
                f"states have {len(slots)} slots, the cache entry {len(cache_entry.cache)}"
            )
        cache_entry.cache = [mx.contiguous(s) for s in slots]
        cache_entry.advance(int(self.depths[node]) + 1)


def _levels(tree) -> Tuple[np.ndarray, List[np.ndarray], np.ndarray]:
    depths = np.asarray(tree.depths())
    levels = [np.flatnonzero(depths == d) for d in range(int(depths.max()) + 1)]
    rows = np.empty(len(depths), dtype=np.int64)
    for nodes in levels:
        rows[nodes] = np.arange(len(nodes))
    return depths, levels, rows


def tree_mixer_forward(mixer, x: mx.array, tree, cache=None) -> Tuple[mx.array, TreeStates]:
    """Run ``mixer`` over the flattened tree ``x`` ([1, n, D]), each node from
    its parent's state, the root from ``cache``'s. Writes nothing to ``cache``.

    Returns the outputs [1, n, D] in flattened node order and the per-node
    states. Each depth is one call of the unmodified mixer on a batch of that
    depth's nodes."""
    n = len(tree)
    if x.ndim != 3 or x.shape[0] != 1 or x.shape[1] != n:
        raise ValueError(f"expected inputs [1, {n}, D] for a {n}-node tree, got {x.shape}")
    _check(mixer, cache)
    depths, levels, rows = _levels(tree)
    parents = np.asarray(tree.parents)
    n_slots = len(cache.cache) if cache is not None else len(_slots_fn(mixer)(mixer))
    # The root's parent state is the cached one (None slots: the mixer makes
    # its own zeros, exactly as a plain forward on an empty cache does).
    prev = list(cache.cache) if cache is not None else [None] * n_slots
    outs, states = [], []
    for d, nodes in enumerate(levels):
        if d > 0:
            # Parents of depth-d nodes all sit at depth d-1: gather their rows.
            idx = mx.array(rows[parents[nodes]])
            prev = [mx.take(s, idx, axis=0) for s in prev]
        step = ArraysCache(n_slots)
        step.cache = list(prev)
        xd = mx.take(x[0], mx.array(nodes), axis=0)[:, None, :]
        y = mixer(xd, None, step)
        prev = list(step.cache)
        outs.append(y[:, 0])
        states.append(prev)
    order = np.concatenate(levels)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    out = mx.take(mx.concatenate(outs, axis=0), mx.array(inverse), axis=0)[None]
    return out, TreeStates(depths, states, rows)


class TreeGatedDeltaNet(StandIn):
    """Stand-in for a gated-delta mixer during one tree verify forward.

    Same call signature as the mixer. Writes nothing to the cache; after the
    call ``states`` holds every node's state for the commit."""

    def __init__(self, mixer: nn.Module, tree):
        super().__init__()
        if not is_gated_delta_mixer(mixer):
            raise TypeError(f"{type(mixer).__name__} is not a known gated-delta mixer")
        self.mixer = mixer
        self.tree = tree
        self.states = None

    def __call__(self, inputs: mx.array, mask: Optional[mx.array] = None, cache=None):
        # The model passes cache.make_mask(n): None, or all True once left
        # padding is consumed (cache_refusal refuses the rest). All-True masks
        # leave every value unchanged, so the mask can be dropped.
        if mask is not None and not bool(mx.all(mask).item()):
            raise TreeRefused(_family(self.mixer), "a padding mask hides tree nodes")
        out, self.states = tree_mixer_forward(self.mixer, inputs, self.tree, cache)
        return out


# --------------------------------------------------------------------------
# Model level: swap every mixer for the duration of one verify forward.


def tree_refusal(model, tree, cache: Optional[Sequence[Any]] = None, limit: Optional[int] = None) -> Optional[str]:
    """Why ``tree_recurrence`` would refuse, or None. Writes nothing."""
    mixers = recurrent_mixers(model)
    if not mixers:
        return None
    for i, layer, attr in mixers:
        m = getattr(layer, attr)
        if isinstance(m, StandIn):
            return f"layer {i}: a tree verify is already in progress"
        why = backend_refusal(m) or (cache_refusal(cache[i]) if cache is not None else None)
        if why:
            return f"layer {i}: {why}"
    return footprint_refusal(model, len(tree), limit)


@contextmanager
def tree_recurrence(model, tree, cache: Optional[Sequence[Any]] = None, limit: Optional[int] = None):
    """Swap every gated-delta mixer of ``model`` for a ``TreeGatedDeltaNet``
    (instance level) for the duration of the block; yields the stand-ins by
    cache index. Refusals happen on entry, before anything is swapped or
    written. Attention layers are the caller's business (tree mask and
    per-node positions)."""
    why = tree_refusal(model, tree, cache, limit)
    if why:
        raise TreeRefused(_family(model), why)
    mixers = recurrent_mixers(model)
    wrappers = {}
    try:
        for i, layer, attr in mixers:
            w = TreeGatedDeltaNet(getattr(layer, attr), tree)
            setattr(layer, attr, w)
            wrappers[i] = w
        yield wrappers
    finally:
        for i, layer, attr in mixers:
            if i in wrappers:
                setattr(layer, attr, wrappers[i].mixer)


class TreeGatedDelta:
    """The ``RecurrentStrategy`` (treespec.verify.recurrent) for gated-delta
    layers: each adapter gets its own, holding the per-node states of its
    last verify until the adapter hands them to the commit."""

    name = "tree GatedDeltaNet"

    def __init__(self, limit: Optional[int] = None, chains: bool = False):
        # chains=True: a chain too goes through the per-depth recurrence (one
        # mixer call per node: slow; correct by construction, so
        # treespec.numerics measures this recurrence's own kernels with it).
        self.limit, self.chains = limit, chains
        self._last = None  # (cache list, {cache index: stand-in})

    def refusal(self, model, caches, tree) -> Optional[str]:
        return tree_refusal(model, tree, caches, self.limit)

    @contextmanager
    def inject(self, model, caches, tree):
        self._last = None
        if tree.is_linear() and not self.chains:
            # A chain through the recurrence is the sequence itself: exact
            # through the mixer's own multi-token path, which is much faster
            # than one call per depth. Commit then replays the path from the
            # snapshot.
            yield None
            return
        with tree_recurrence(model, tree, caches, self.limit) as wrappers:
            yield wrappers
        self._last = (caches, wrappers)

    def kept_states(self) -> list:
        """(cache entry, TreeStates) of every layer the last injected verify
        kept per-node states for; handed over once (then dropped here)."""
        if self._last is None:
            return []
        caches, wrappers = self._last
        self._last = None
        return [(caches[i], w.states) for i, w in wrappers.items() if w.states is not None]
