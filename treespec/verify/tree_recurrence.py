"""Tree-aware recurrence: every recurrent mixer of an mlx-lm model, one mechanism.

A recurrent mixer (GatedDeltaNet, Mamba, Mamba2, LFM2's short conv, RG-LRU,
RWKV7's time and channel mixing, gated linear attention, an n-gram context)
keeps its state in an ``ArraysCache``: conv windows, SSM or delta-rule
states, token shifts. Run over a flattened tree it is wrong: a node would
inherit its flattened predecessor's state (a sibling, or a cousin's leaf)
instead of its parent's.

Here every node starts from its PARENT's state, the root from the cached
one. Nodes of one depth are independent of each other, so they run as one
batch: the unmodified mixer is called once per depth with inputs
``[n_d, 1, ...]`` and a scratch ``ArraysCache`` whose slots hold the
parents' states gathered along the batch axis. The mixer's own code does all
the math. A tree of depth ``d`` costs ``d + 1`` mixer calls whatever its
width. Calling the real module, rather than a copy of its math, is what
keeps this bit-identical to the model's own one-token steps: every op sees
the same values in the same per-row order.

Each call is the one-token step a plain decode step makes, so its arguments
are the ones such a step gets: the input and every other per-node argument
(``[1, n, ...]``: rwkv7's ``v_first``) gathered to the depth's nodes, an
``offset`` argument advanced by the depth (gated linear attention rotates by
it), and ``mask`` None (what ``create_attention_mask`` and
``create_ssm_mask`` give one token of an unpadded cache; padded caches are
refused). Where a mixer's one-token step and its multi-token scan differ
inside mlx-lm (the Mamba2 family's chunked scan), the tree verify therefore
equals classic decoding, which steps, and not a multi-token forward.

Every node's state after its step is kept, per depth level, stacked over the
level's nodes (:class:`TreeStates`), for the slots the mixer assigns (two
mixers sharing one cache keep their own slots). Committing the accepted node
is then a gather, no replay. The price is memory (treespec.verify.footprint):
trees whose per-node states exceed a limit are refused before anything runs.

    tree_mixer_forward(mixer, x, tree, cache, **args) -> (out, TreeStates)
    TreeMixer(mixer, tree)             the stand-in, same call as the mixer
    tree_recurrence(model, tree, ...)  context manager: every mixer swapped
    TreeRecurrence(limit)              the RecurrentStrategy the adapter uses
"""

import inspect
import threading
from contextlib import contextmanager
from typing import Any, Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import ArraysCache

from .. import standin
from ..caches import leaves
from ..errors import TreeRefused
from ..mixers import Discovery, discover, set_slot
from .footprint import footprint_refusal, kept_nodes

__all__ = ["StandIn", "TreeMixer", "TreeRecurrence", "TreeStates",
           "tree_mixer_forward", "tree_recurrence"]


def _family(obj) -> str:
    """model_type of a model, or the mlx-lm module name of a mixer."""
    mt = getattr(obj, "model_type", None) or getattr(getattr(obj, "args", None), "model_type", None)
    if mt:
        return str(mt)
    return type(obj).__module__.rsplit(".", 1)[-1]


class StandIn(standin.StandIn):
    """Base of a module that stands in for a mixer during one verify
    (``self.mixer`` is the real one, so the mixer is still found there)."""

    WRAPS = "mixer"


# --------------------------------------------------------------------------
# Refusals. None names a backend: where mlx-lm runs a kernel for the
# recurrence (gated_delta_update, rwkv7's wkv7 and the Mamba2 SSM step on a
# Metal GPU), each per-depth call hands it one token per batch row from the
# parents' states, and whether that is classic decoding's arithmetic is the
# gate's measurement (treespec.evidence.gate: its probe verifies the run's
# branching shapes through this same per-depth path, against one-token
# steps), never a guess from the device's name.


def cache_refusal(cache) -> Optional[str]:
    """The tree verify is single-sequence. A right-padded batch (``lengths``)
    or left padding not yet consumed would mask tree nodes away."""
    if cache is None:
        return None
    if not isinstance(cache, ArraysCache):
        return f"the tree-aware recurrence needs an ArraysCache, got {type(cache).__name__}"
    if cache.lengths is not None:
        return ("ArraysCache.lengths is set (a right-padded batch being prefilled); "
                "call cache.finalize() first")
    bs = cache.batch_size
    if bs != 1:
        return f"the tree-aware recurrence needs batch size 1, the ArraysCache holds {bs}"
    lp = cache.left_padding
    if lp is not None and int(mx.max(lp).item()) > 0:
        return f"ArraysCache.left_padding still masks {int(mx.max(lp).item())} positions of the next forward"
    return None


def _check(module, cache) -> None:
    why = cache_refusal(cache)
    if why:
        raise TreeRefused(_family(module), why)


# --------------------------------------------------------------------------
# The per-depth forward.


class TreeStates:
    """Per-node cache slots of one mixer after a tree forward.

    ``levels[d]`` holds the slots of depth ``d``'s nodes, stacked along axis
    0 in node order (None for a slot the mixer never assigns); ``rows[i]`` is
    node i's row in its level. ``merge`` puts the records of two mixers that
    share one cache together."""

    def __init__(self, depths: np.ndarray, levels: List[List[Optional[mx.array]]], rows: np.ndarray):
        self.depths = depths
        self.levels = levels
        self.rows = rows

    def __len__(self) -> int:
        return len(self.depths)

    def node(self, i: int) -> List[Optional[mx.array]]:
        """Node i's cache slots, each with a batch axis of 1 (None: a slot
        this state does not hold)."""
        if not 0 <= i < len(self.depths):
            raise IndexError(f"node {i} is not in a tree of {len(self.depths)} nodes")
        r = int(self.rows[i])
        return [None if s is None else s[r : r + 1] for s in self.levels[int(self.depths[i])]]

    def arrays(self) -> List[mx.array]:
        return [s for level in self.levels for s in level if s is not None]

    def merge(self, other: "TreeStates") -> "TreeStates":
        levels = [[b if b is not None else a for a, b in zip(la, lb)]
                  for la, lb in zip(self.levels, other.levels)]
        return TreeStates(self.depths, levels, self.rows)

    def write(self, cache_entry: ArraysCache, node: int) -> None:
        """Make ``cache_entry`` what one-token steps over ``node``'s root path
        would have left: that node's slots (the others untouched), the
        bookkeeping advanced by the path length. No replay."""
        slots = self.node(node)  # validates node before anything is written
        if len(slots) != len(cache_entry.cache):
            raise ValueError(f"states have {len(slots)} slots, the cache entry {len(cache_entry.cache)}")
        cache_entry.cache = [c if s is None else mx.contiguous(s)
                             for s, c in zip(slots, cache_entry.cache)]
        cache_entry.advance(int(self.depths[node]) + 1)


def _levels(tree) -> Tuple[np.ndarray, List[np.ndarray], np.ndarray]:
    depths = np.asarray(tree.depths())
    levels = [np.flatnonzero(depths == d) for d in range(int(depths.max()) + 1)]
    rows = np.empty(len(depths), dtype=np.int64)
    for nodes in levels:
        rows[nodes] = np.arange(len(nodes))
    return depths, levels, rows


def _params(mixer) -> List[str]:
    return list(inspect.signature(mixer.__call__).parameters)


def _at_depth(name, value, sel, n, d):
    """One argument of the depth-``d`` call: per-node arrays gathered to the
    depth's nodes, an ``offset`` advanced by the depth, the rest as given."""
    if isinstance(value, mx.array) and value.ndim >= 2 and value.shape[0] == 1 and value.shape[1] == n:
        return mx.take(value[0], sel, axis=0)[:, None]
    if name == "offset" and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return value + d
    return value


def _reassemble(parts, inverse):
    """Per-depth outputs (batch n_d, length 1) back to [1, n, ...] in node order."""
    first = parts[0]
    if isinstance(first, mx.array):
        return mx.take(mx.concatenate([p[:, 0] for p in parts], axis=0), inverse, axis=0)[None]
    if first is None:
        return None
    if isinstance(first, (tuple, list)):
        return type(first)(_reassemble([p[i] for p in parts], inverse) for i in range(len(first)))
    raise TypeError(f"cannot reassemble a mixer output of type {type(first).__name__}")


def tree_mixer_forward(mixer, x: mx.array, tree, cache: ArraysCache, **args):
    """Run ``mixer`` over the flattened tree ``x`` ([1, n, ...]), each node
    from its parent's state, the root from ``cache``'s. Writes nothing to
    ``cache``. ``args``: the mixer's other arguments (``mask`` is dropped).

    Returns the outputs in flattened node order (as the mixer returns them:
    an array, or a tuple such as rwkv7's ``(out, v_first)``) and the
    per-node states. Each depth is one call of the unmodified mixer on a
    batch of that depth's nodes."""
    n = len(tree)
    if x.ndim < 2 or x.shape[0] != 1 or x.shape[1] != n:
        raise ValueError(f"expected inputs [1, {n}, ...] for a {n}-node tree, got {x.shape}")
    if not isinstance(cache, ArraysCache):
        raise TypeError(f"expected the mixer's ArraysCache, got {type(cache).__name__}")
    _check(mixer, cache)
    params = _params(mixer)
    depths, levels, rows = _levels(tree)
    parents = np.asarray(tree.parents)
    n_slots = len(cache.cache)
    # The root's parent state is the cached one (None slots: the mixer makes
    # its own zeros, exactly as a plain forward on an empty cache does).
    prev = list(cache.cache)
    touched = [False] * n_slots
    outs, states = [], []
    for d, nodes in enumerate(levels):
        if d > 0:
            # Parents of depth-d nodes all sit at depth d-1: gather their rows.
            idx = mx.array(rows[parents[nodes]])
            prev = [None if s is None else mx.take(s, idx, axis=0) for s in prev]
        step = ArraysCache(n_slots)
        step.cache = list(prev)
        sel = mx.array(nodes)
        call = {k: _at_depth(k, v, sel, n, d) for k, v in args.items() if k != "mask"}
        call[params[0]] = mx.take(x[0], sel, axis=0)[:, None]
        call["cache"] = step
        if "mask" in params:
            call["mask"] = None
        handed = list(step.cache)
        outs.append(mixer(**call))
        touched = [t or a is not b for t, a, b in zip(touched, step.cache, handed)]
        prev = list(step.cache)
        states.append(prev)
    inverse = np.empty(n, dtype=np.int64)
    inverse[np.concatenate(levels)] = np.arange(n)
    out = _reassemble(outs, mx.array(inverse))
    kept = [[s if t else None for s, t in zip(level, touched)] for level in states]
    return out, TreeStates(depths, kept, rows)


class TreeMixer(StandIn):
    """Stand-in for one recurrent mixer during one tree verify forward.

    Same call as the mixer. Handed an ArraysCache it runs the tree per depth
    and writes nothing to the cache; ``records`` then holds ``(cache,
    TreeStates)`` of every such call for the commit. Handed anything else
    (falcon_h1's attention shares the layer) it runs the mixer unchanged. In
    any thread but the verifying one it is the mixer itself."""

    def __init__(self, mixer: nn.Module, tree):
        super().__init__()
        self.mixer = mixer
        object.__setattr__(self, "_tree", tree)
        object.__setattr__(self, "_signature", inspect.signature(mixer.__call__))
        object.__setattr__(self, "records", [])
        object.__setattr__(self, "_thread", threading.get_ident())

    def __call__(self, *args, **kwargs):
        if threading.get_ident() != self._thread:
            return self.mixer(*args, **kwargs)
        try:
            bound = self._signature.bind(*args, **kwargs).arguments
        except TypeError:
            return self.mixer(*args, **kwargs)
        cache = bound.get("cache")
        if not isinstance(cache, ArraysCache):
            return self.mixer(*args, **kwargs)
        names = list(bound)
        x = bound[names[0]]
        rest = {k: v for k, v in bound.items() if k not in (names[0], "cache")}
        out, states = tree_mixer_forward(self.mixer, x, self._tree, cache, **rest)
        self.records.append((cache, states))
        return out


# --------------------------------------------------------------------------
# Model level: swap every mixer for the duration of one verify forward.


def tree_refusal(model, tree, cache: Optional[Sequence[Any]] = None, limit: Optional[int] = None,
                 found: Optional[Discovery] = None) -> Optional[str]:
    """Why ``tree_recurrence`` would refuse, or None. Writes nothing."""
    found = discover(model) if found is None else found
    if found.refusal:
        return found.refusal
    for m in found.mixers:
        current = m.current()
        if isinstance(current, StandIn):
            return f"{m.path}: a tree verify is already in progress"
    if cache is not None:
        for where, c in leaves(cache):
            if type(c) is ArraysCache:
                why = cache_refusal(c)
                if why:
                    return f"layer {'.'.join(map(str, where))}: {why}"
    return footprint_refusal(found, kept_nodes(tree), limit)


@contextmanager
def tree_recurrence(model, tree, cache: Optional[Sequence[Any]] = None, limit: Optional[int] = None,
                    found: Optional[Discovery] = None):
    """Swap every recurrent mixer of ``model`` for a :class:`TreeMixer`
    (instance level) for the duration of the block; yields the stand-ins.
    Refusals happen on entry, before anything is swapped or written.
    Attention layers are the caller's business (tree mask and per-node
    positions)."""
    found = discover(model) if found is None else found
    why = tree_refusal(model, tree, cache, limit, found)
    if why:
        raise TreeRefused(_family(model), why)
    swapped = []
    try:
        for m in found.mixers:
            w = TreeMixer(m.current(), tree)
            set_slot(m.container, m.key, w)
            swapped.append((m, w))
        yield [w for _, w in swapped]
    finally:
        for m, w in reversed(swapped):
            set_slot(m.container, m.key, w.mixer)


class TreeRecurrence:
    """The ``RecurrentStrategy`` (treespec.verify.strategy) for every
    recurrent mixer: each adapter gets its own, holding the per-node states
    of its last verify until the adapter hands them to the commit."""

    name = "tree recurrence"

    def __init__(self, limit: Optional[int] = None, chains: bool = False):
        # chains=True: a chain too goes through the per-depth recurrence (one
        # mixer call per node: slow; correct by construction, so
        # treespec.evidence.numerics measures this recurrence's own kernels with it).
        self.limit, self.chains = limit, chains
        self._found: Optional[Tuple[int, Discovery]] = None
        self._last = None  # the stand-ins of the last branching verify

    def use(self, model, found: Discovery) -> None:
        """Take the adapter's discovery of ``model``'s mixers (saves a forward)."""
        self._found = (id(model), found)

    def discovery(self, model) -> Discovery:
        """Where the model's mixers are (one scratch forward, once per model)."""
        if self._found is None or self._found[0] != id(model):
            self._found = (id(model), discover(model))
        return self._found[1]

    def refusal(self, model, caches, tree) -> Optional[str]:
        return tree_refusal(model, tree, caches, self.limit, self.discovery(model))

    @contextmanager
    def inject(self, model, caches, tree):
        self._last = None
        if tree.is_linear() and not self.chains:
            # A chain through the recurrence is the sequence itself: a plain
            # forward through the mixer's own multi-token path (mlx-lm's own
            # chain verify), much faster than one call per depth. Commit then
            # replays the path from the snapshot.
            yield None
            return
        with tree_recurrence(model, tree, caches, self.limit, self.discovery(model)) as wrappers:
            yield wrappers
        self._last = wrappers

    def kept_states(self) -> list:
        """(cache entry, TreeStates) of every recurrent cache the last
        injected verify kept per-node states for (the records of mixers that
        share one cache merged); handed over once (then dropped here)."""
        if self._last is None:
            return []
        wrappers, self._last = self._last, None
        merged: Dict[int, list] = {}
        for w in wrappers:
            for cache, states in w.records:
                if id(cache) in merged:
                    merged[id(cache)][1] = merged[id(cache)][1].merge(states)
                else:
                    merged[id(cache)] = [cache, states]
        return [(c, s) for c, s in merged.values()]
