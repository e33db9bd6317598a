"""Attention verified depth by depth: every node's query over exactly the keys
a one-token step at that node attends to. The attention half of the
row-invariant verify (docs/verify.md#the-row-invariant-verify).

A tree verify normally runs attention as one call over the flattened tree,
every node's query over all keys with the non-ancestors masked. On a backend
whose attention kernel picks its tiling by the number of queries or keys
(a GPU, a BLAS), a node's row then differs from the row classic decoding
computes: one query over the history and its own root path, no mask. Here each
attention module runs twice per verify, through its own code:

1. **wide**: once over all T nodes, the nodes on the batch axis (x is
   (T, 1, D)), each node's positions handed to its rope as one offset per
   batch row. Its projections (every linear child of the attention) run once
   over the T rows and their outputs are kept; its cache update writes the T
   nodes' keys and values into the real cache, in flattened order, as every
   verify does. Its attention output is never used, so MLX never computes it.
2. **by depth**: once per depth d, the nodes of that depth on the batch axis.
   The projections hand back their kept rows (no weight is read again), so
   does the rope (the wide pass rotated every row at its node's position),
   and the cache hands every
   row the history's keys followed by its root path's (its ancestors', in
   depth order, then its own): ``offset + d + 1`` keys, contiguous, no mask,
   the key count, order and values of a one-token step at that node. The
   output projection is held back (it hands back its input).

The T attention outputs are put back in node order and the output projection
runs once over them. What a node's row then equals a one-token step's rests
on the backend giving a row of a batched call the bits it has alone (the
census's ``batch`` rows for the projections, attention and rope), measured,
never assumed: the gate probes this verify like any other.

Why the rope's rows are kept rather than rotated again per depth: a rope
call costs the host about 9 us of graph building on a 2-core CPU (an add
about 1), and two per attention per depth were half of what the depth passes
added to a 32-layer verify's graph (results/exact-at-speed, graph_build.py),
which a GPU waits for. Its rows are the same either way on a backend whose
rope keeps batch rows (the census's rope rows; the gate measures the verify).

The attention module must return its output projection's result as is (the
wide pass checks it, and refuses otherwise) and call each linear child once.
"""

import inspect
from typing import List, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import TreeRefused
from ..mixers import slots
from ..standin import StandIn
from .per_node import AttentionStandIn

__all__ = ["DepthSteps", "KernelLinear", "KeptRoPE", "Layout", "Projection", "depth_groups",
           "projections"]

_LINEARS = (nn.Linear, nn.QuantizedLinear)


def projections(attention: nn.Module) -> List[Tuple[str, object, object, nn.Module]]:
    """``(path, container, key, module)`` of every linear child of
    ``attention`` (dense or quantized), in module order."""
    return [s for s in slots(attention) if not isinstance(s[1], KernelLinear)  # not its inner
            and (isinstance(s[3], _LINEARS + (KernelLinear,))
                 or (hasattr(s[3], "bits") and "scales" in s[3] and "weight" in s[3]))]


class KernelLinear(StandIn):
    """Stands in for one linear layer (or a tied embedding, whose ``as_linear``
    is the output head) during one verify forward: ``call(layer, x)`` computes it (treespec.backend.row_kernels.linear_rows: every row as
    the backend's one-row kernel computes it, the weights read once)."""

    def __init__(self, linear: nn.Module, call):
        super().__init__()
        self.inner = linear
        object.__setattr__(self, "call", call)

    def __call__(self, x):
        if isinstance(self.inner, (nn.Embedding, nn.QuantizedEmbedding)):
            return self.inner(x)  # a lookup; only its use as the output head is a product
        return self.call(self.inner, x)

    def as_linear(self, x):
        return self.call(self.inner, x)


def depth_groups(tree_depths: np.ndarray, ancestry: np.ndarray) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Per depth d of a tree (node depths ``tree_depths``; ``ancestry[i, j]``:
    node j is node i or one of its ancestors), ``(nodes, paths)``: the nodes
    of depth d in flattened order, and for each its root path (d + 1 node
    indices, depth order, the node itself last). Pure index work."""
    out = []
    for d in range(int(tree_depths.max()) + 1 if len(tree_depths) else 0):
        nodes = np.flatnonzero(tree_depths == d)
        paths = np.stack([np.flatnonzero(ancestry[i]) for i in nodes])
        # ancestors precede their descendants in a tree's flattened order, so
        # the ascending indices of a root path are in depth order
        out.append((nodes, paths))
    return out


class _PassStandIn(StandIn):
    """A child of an attention standing in for it during one verify forward,
    switched pass by pass by :class:`DepthSteps` (:meth:`set`): ``keep`` in
    the wide pass (compute and keep), ``rows`` in a depth's pass (hand back
    the kept output's rows of that depth, ``rows``), ``off`` outside a
    forward (the child itself). What is kept is dropped on entering and on
    leaving a forward."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.set("off")

    def _empty(self):
        return None

    def set(self, mode: str, rows=None):
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "rows", rows)
        if mode in ("keep", "off"):
            object.__setattr__(self, "kept", self._empty())


class Projection(_PassStandIn):
    """Stands in for one linear child of an attention (:class:`_PassStandIn`);
    ``keep`` keeps its one call's output; ``hold``: hand back the input (the
    output projection, run once afterwards)."""

    def __call__(self, x):
        if self.mode == "keep":
            if self.kept is not None:
                raise TreeRefused(None, "the row-invariant verify needs each linear of an "
                                  "attention called once per forward; one is called twice")
            object.__setattr__(self, "kept", self.inner(x))
            return self.kept
        if self.mode == "rows":
            return _pick(self.kept, self.rows)
        if self.mode == "off":
            return self.inner(x)
        return x


class KeptRoPE(_PassStandIn):
    """Stands in for an attention's rope (:class:`_PassStandIn`): ``keep``
    keeps each call's output, in call order; in ``rows`` the n-th call of a
    depth's pass gets the kept n-th output's rows, which must have the shape
    that call's input has (else the attention ropes differently per pass:
    refused)."""

    def _empty(self):
        return []

    def set(self, mode: str, rows=None):
        super().set(mode, rows)
        object.__setattr__(self, "at", 0)  # the pass's calls so far

    def __call__(self, x, *args, **kwargs):
        if self.mode == "off":
            return self.inner(x, *args, **kwargs)
        if self.mode == "keep":
            self.kept.append(self.inner(x, *args, **kwargs))
            return self.kept[-1]
        at = self.at
        object.__setattr__(self, "at", at + 1)
        out = _pick(self.kept[at], self.rows) if at < len(self.kept) else None
        if out is None or out.shape != x.shape:
            raise TreeRefused(None, "the row-invariant verify needs an attention's rope called "
                              "alike in every pass (its depth passes reuse the wide pass's "
                              f"rotated rows); call {at + 1} differs")
        return out


def _rows_of(nodes: np.ndarray):
    """A slice where ``nodes`` are consecutive (a view, no gather), else an index array."""
    if len(nodes) and nodes[-1] - nodes[0] + 1 == len(nodes):
        return slice(int(nodes[0]), int(nodes[-1]) + 1)
    return mx.array(nodes, dtype=mx.uint32)


def _pick(x: mx.array, rows) -> mx.array:
    return x[rows] if isinstance(rows, slice) else mx.take(x, rows, axis=0)


class _Group:
    """One depth of a tree at one history length, for every layer of one
    forward: its batch rows, the nodes' positions, and where each node's
    keys are (a view of the first ``view`` cache rows for a lone node on the
    flattened tree's first nodes, else ``path``: the cache rows of its root
    path, gathered after the broadcast history)."""

    def __init__(self, nodes: np.ndarray, paths: np.ndarray, depth: int, history: int):
        n, length = paths.shape
        self.rows = _rows_of(nodes)
        self.positions = mx.full((n,), history + depth, dtype=mx.int32)
        self.view = (history + length if n == 1 and (paths[0] == np.arange(length)).all()
                     else None)
        self.path = mx.array((history + paths).reshape(-1), dtype=mx.uint32)
        self.n, self.length, self.history = n, length, history


class Layout:
    """A tree's depths as every attention of one verify forward runs them
    (:func:`depth_groups`), index arrays made once per history length and
    shared by the layers."""

    def __init__(self, groups: Sequence[Tuple[np.ndarray, np.ndarray]]):
        self.groups = list(groups)
        order = np.concatenate([n for n, _ in groups]) if groups else np.zeros(0, np.int64)
        self.unsort = (None if (order == np.arange(len(order))).all()
                       else mx.array(np.argsort(order), dtype=mx.uint32))
        self._at = {}

    def at(self, history: int) -> List[_Group]:
        if history not in self._at:
            self._at[history] = [_Group(n, p, d, history) for d, (n, p) in enumerate(self.groups)]
        return self._at[history]


class _Keys:
    """The cache a depth's pass sees: ``offset`` the nodes' positions (one
    per batch row), ``update_and_fetch`` hands every row the history's keys
    and values and then its root path's, from what the wide pass wrote."""

    def __init__(self, keys: mx.array, values: mx.array, group: _Group):
        self.offset = group.positions
        self._group, self._keys, self._values = group, keys, values

    def _fetch(self, v: mx.array) -> mx.array:
        g = self._group
        if g.view is not None:
            return v[:, :, :g.view, :]
        # (1, H, L, d) -> (n, H, history + depth + 1, d)
        H, d = v.shape[1], v.shape[3]
        path = mx.take(v[0], g.path, axis=1).reshape(H, g.n, g.length, d).transpose(1, 0, 2, 3)
        history = mx.broadcast_to(v[:, :, :g.history, :], (g.n, H, g.history, d))
        return mx.concatenate([history, path], axis=2)

    def update_and_fetch(self, keys, values):
        return self._fetch(self._keys), self._fetch(self._values)


class _Wide:
    """The cache the wide pass sees: positions per batch row; the T rows it
    is handed (node t on batch row t) go into the real cache as one update of
    T tokens in flattened order; what the cache then holds is kept."""

    def __init__(self, inner, positions: mx.array):
        self.inner, self.offset = inner, positions
        self.fetched = None

    def update_and_fetch(self, keys, values):
        self.fetched = self.inner.update_and_fetch(keys.swapaxes(0, 2), values.swapaxes(0, 2))
        return keys, values  # its attention output is never read


class DepthSteps(AttentionStandIn):
    """Stands in for one attention module during one verify forward (module
    docstring). ``layout``: the tree's :class:`Layout`, shared by the forward's
    attentions; ``depths`` (T,) int32 node depths."""

    WHAT = "row-invariant attention"

    def __init__(self, attention: nn.Module, depths: mx.array, layout: Layout,
                 linears: Sequence[Projection], ropes: Sequence[KeptRoPE] = ()):
        super().__init__(attention, depths)
        object.__setattr__(self, "_layout", layout)
        object.__setattr__(self, "_linears", list(linears))
        object.__setattr__(self, "_ropes", list(ropes))
        # Called once per depth: by name where every parameter can be named
        # (mlx-lm's attentions), which spares the host rebuilding
        # BoundArguments.args/kwargs per call; else through them.
        named = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                    for p in self._signature.parameters.values())
        object.__setattr__(self, "_by_name", named)

    def _call(self, bound: inspect.BoundArguments):
        if self._by_name:
            return self.inner(**bound.arguments)
        return self.inner(*bound.args, **bound.kwargs)

    def rebind(self, depths: mx.array, layout: Layout):
        """Ready for another forward over another tree, the attention and its
        projections' stand-ins the same (treespec.verify.row_invariant reuses
        them while the model's slots still hold what they were made for)."""
        super().rebind(depths)
        object.__setattr__(self, "_layout", layout)

    def run(self, bound: inspect.BoundArguments, first: str):
        given = bound.arguments
        x, cache = given[first], given.get("cache")
        _, T, D = x.shape
        history = cache.offset
        rows = x.reshape(T, 1, D)
        children = self._linears + self._ropes
        for c in children:
            c.set("keep")
        wide = _Wide(cache, history + self._depths)
        given[first], given["mask"], given["cache"] = rows, None, wide
        out = self._call(bound)
        last = [p for p in self._linears if p.kept is out]
        if len(last) != 1 or wide.fetched is None:
            raise TreeRefused(None, f"{type(self.inner).__name__} does not return its output "
                              "projection's result as is (or writes no cache): the "
                              "row-invariant verify cannot run its attention by depth")
        last[0].set("hold")
        keys, values = wide.fetched
        parts = []
        for group in self._layout.at(history):
            for c in children:
                if c is not last[0]:
                    c.set("rows", group.rows)
            given[first] = _pick(rows, group.rows)
            given["cache"] = _Keys(keys, values, group)
            parts.append(self._call(bound))
        attended = mx.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
        if self._layout.unsort is not None:
            attended = mx.take(attended, self._layout.unsort, axis=0)
        out = last[0].inner(attended)
        for c in children:
            c.set("off")
        return out.reshape(1, T, *out.shape[2:])
