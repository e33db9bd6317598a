"""Attentions whose one-token step takes a code path of its own, verified
node by node on the batch axis.

Multi-head latent attention (mlx-lm's deepseek_v3 and the families built on
``mlx_lm.models.mla.MultiLinear``) branches on the number of tokens: for
``L == 1`` it absorbs the key projection into the query and attends over the
cached latents themselves, for ``L > 1`` it expands the latents into per-head
keys and values. Classic decoding runs only the first branch; a forward over
a flattened tree (or over a chain: mlx-lm's own chain verify) runs only the
second, so its rows are not classic decoding's, by a rounding difference
that can flip a greedy token.

A tree verify therefore runs such an attention with the tree's nodes on the
batch axis, one token each: ``x`` (1, T, D) becomes (T, 1, D), so the module
takes its ``L == 1`` branch for every node at once. Its cache is handed as a
:class:`NodeRows` view: ``offset`` is each node's position (``offset +
depth``, one per batch row, which every RoPE of
treespec.verify.attention.TREE_ROPES takes), ``update_and_fetch`` writes the
T rows into the real cache in flattened order (exactly what the multi-token
forward writes: the latents do not depend on the branch) and hands every
batch row the cache's keys, and the node's row of the tree mask hides what
is not its ancestor. Node i then computes what a one-token step after its
root path computes, on keys where the non-ancestors are masked.

Pure index work and one reshape each way; the module's own code does the
arithmetic.
"""

import inspect
import threading
from typing import List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.mla import MultiLinear, QuantizedMultiLinear

from ..mixers import slots
from ..standin import StandIn

__all__ = ["AttentionStandIn", "NodeRows", "NodeSteps", "one_token_attentions"]

_LATENT = (MultiLinear, QuantizedMultiLinear)


def one_token_attentions(model: nn.Module,
                         walked: Optional[list] = None) -> List[Tuple[str, object, object, nn.Module]]:
    """``(path, container, key, module)`` of every multi-head latent
    attention of ``model`` (a module with a ``MultiLinear`` child, which absorbs the key projection
    on its one-token path), in model order, but those that select their keys (deepseek_v32's
    ``indexer``: its top-k would rank the tree's non-ancestors too, and gather the keys in another
    order than a step does). Those keep the multi-token path (docs/families.md#refused-and-why).
    ``walked``: ``slots(model)`` if the caller has it."""
    return [(path, container, key, m) for path, container, key, m in
            (slots(model) if walked is None else walked)
            if "indexer" not in m and any(isinstance(v, _LATENT) for v in m.values())]


class NodeRows:
    """A cache as T one-token steps see it, the steps on the batch axis.

    Reads and writes go to the real cache ``inner``: the T rows a forward
    hands ``update_and_fetch`` (batch row t = node t) are written as one
    update of T tokens, and every batch row gets all the keys back (a
    broadcast, no copy). Anything else is the real cache's."""

    def __init__(self, inner, positions: mx.array):
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "positions", positions)

    @property
    def offset(self):
        return self.positions

    def update_and_fetch(self, keys, values):
        T = keys.shape[0]
        # (T, H, 1, d) -> (1, H, T, d): node t at flattened slot t
        got = self.inner.update_and_fetch(keys.swapaxes(0, 2), values.swapaxes(0, 2))
        return tuple(_rows(g, T) for g in got)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        setattr(self.inner, name, value)

    def __getitem__(self, i):  # a CacheList the attention indexes
        return NodeRows(self.inner[i], self.positions)


def _rows(fetched, T):
    if isinstance(fetched, (tuple, list)):  # a quantized cache: (packed, scales, biases)
        return type(fetched)(_rows(f, T) for f in fetched)
    return mx.broadcast_to(fetched, (T,) + tuple(fetched.shape[1:]))


class AttentionStandIn(StandIn):
    """Stands in for one attention module during one verify forward over a
    tree of ``depths.size`` nodes; in any thread but the verifying one it is
    the attention it stands in for. Subclasses run the verifying thread's
    call in :meth:`run` with the call's arguments bound by name."""

    WHAT = "attention"

    def __init__(self, attention: nn.Module, depths: mx.array):
        super().__init__()
        self.inner = attention
        object.__setattr__(self, "_signature", inspect.signature(attention.__call__))
        AttentionStandIn.rebind(self, depths)  # this class's part (a subclass's takes more)

    def rebind(self, depths: mx.array):
        """Ready for a forward over a tree of ``depths.size`` nodes, called
        from this thread (at construction, and by a caller that reuses the
        stand-in for another forward)."""
        self._depths = depths
        self._calls = 0
        self._thread = threading.get_ident()

    def __call__(self, *args, **kwargs):
        if threading.get_ident() != self._thread:
            return self.inner(*args, **kwargs)
        bound = self._signature.bind(*args, **kwargs)
        first = next(iter(bound.arguments))
        B, T, _ = bound.arguments[first].shape
        if B != 1 or T != self._depths.size:
            raise RuntimeError(
                f"{self.WHAT} got {B} x {T} tokens for a tree of {self._depths.size} "
                "nodes: this model calls its attention on something other than the verify "
                "tokens")
        self._calls += 1
        return self.run(bound, first)

    def run(self, bound: inspect.BoundArguments, first: str):
        raise NotImplementedError


class NodeSteps(AttentionStandIn):
    """Stands in for one latent attention during one verify forward: each of
    the forward's T tokens a batch row of one token (module docstring).
    ``per_token`` (argument, token axis): a value the module receives per
    position (mistral4's ``attn_scale``, re-indexed by depth before it gets
    here: treespec.verify.positions), laid out per batch row too."""

    WHAT = "per-node attention"

    def __init__(self, attention: nn.Module, depths: mx.array, per_token=None):
        super().__init__(attention, depths)
        object.__setattr__(self, "_per_token", per_token)

    def run(self, bound: inspect.BoundArguments, first: str):
        given = bound.arguments
        x, mask, cache = given[first], given.get("mask"), given.get("cache")
        _, T, D = x.shape
        if not isinstance(mask, mx.array):
            raise RuntimeError(
                f"per-node attention needs the tree mask as an array, got {mask!r}: this "
                "model does not build its mask from cache.make_mask")
        given[first] = x.reshape(T, 1, D)
        given["mask"] = mask.reshape(mask.shape[-2:])[:, None, None, :]  # node t's row
        lead = cache if hasattr(cache, "offset") else cache[0]  # a CacheList: its first
        given["cache"] = NodeRows(cache, lead.offset + self._depths)
        if self._per_token:
            name, axis = self._per_token
            given[name] = _per_row(given[name], axis, T, name)
        out = self.inner(*bound.args, **bound.kwargs)
        return out.reshape(1, T, *out.shape[2:])


def _per_row(value: mx.array, axis: int, T: int, name: str) -> mx.array:
    """A per-position value of shape [..., T (at ``axis``), ...] with every
    other axis 1, as (T, 1, 1, 1): batch row t's, broadcasting against its
    (1, H, 1, D) queries."""
    moved = mx.moveaxis(value, axis, 0)
    if moved.shape[0] != T or moved.size != T:
        raise RuntimeError(f"per-node attention cannot lay out {name!r} of shape "
                           f"{tuple(value.shape)} per node")
    return moved.reshape(T, 1, 1, 1)
