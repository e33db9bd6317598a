"""Tree attention for mlx-lm models: the tree mask and per-node RoPE positions,
injected for one forward and removed afterwards.

No mlx-lm model takes a mask or positions argument. Masks come from
``cache.make_mask(N, window_size=..., return_array=...)`` (through
``create_attention_mask``), positions from ``self.rope(x, offset=cache.offset)``
inside each attention module. So a verify forward over a flattened tree
overrides ``make_mask`` on each cache *instance* (never the class) and swaps
each attention module's ``rope`` *attribute* for a :class:`TreeRoPE` that
rotates node i by ``offset + depth(i)`` instead of ``offset + i``. Both are
restored in a ``finally``; two models (target and drafter) never share a patch.

Everything about a RoPE that can make a tree unverifiable is decided here as
a *reason* (``None`` when fine), and everything about a cache by its entry in
``treespec.caches``, so the adapter can refuse before any cache is written.
"""

import inspect
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import (
    DynamicNTKScalingRoPE,
    Llama3RoPE,
    ProportionalRoPE,
    SuScaledRoPE,
    YarnRoPE,
)

from mlx_lm.models import deepseek_v2, hunyuan, hunyuan_v1_dense, internlm3
from mlx_lm.models.smollm3 import NoPE

from ..caches import attention_caches, mode_of
from ..mixers import set_slot
from ..standin import StandIn
from ..tree import DraftTree
from .per_node import NodeSteps
from .positions import ByDepth, position_inputs

# RoPE classes whose only use of ``offset`` is to hand it to mx.fast.rope, so a
# vector of B*T offsets on the batch axis gives per-node positions (NoPE, the
# identity of smollm3's rope-less layers, ignores it; deepseek_v2's yarn and
# hunyuan's NTK-alpha ropes precompute their frequencies at construction).
# Exact classes, not isinstance: a subclass may override __call__.
TREE_ROPES = (nn.RoPE, Llama3RoPE, YarnRoPE, SuScaledRoPE, ProportionalRoPE, NoPE,
              deepseek_v2.DeepseekV2YarnRotaryEmbedding, hunyuan.DynamicNTKAlphaRoPE,
              hunyuan_v1_dense.DynamicNTKAlphaRoPE)

# The attribute names an attention module holds its rope under (qwen and
# plamo spell it rotary_emb).
ROPE_ATTRS = ("rope", "rotary_emb")

_DYNAMIC_NTK = (
    "computes its base from the scalar offset (max(T + offset, max_pos)): "
    "one forward over a tree has no single offset, and per-node bases "
    "would not match the chain it stands for"
)
# Known RoPE classes that cannot take a vector of positions, and why.
REFUSED_ROPES = {
    DynamicNTKScalingRoPE: _DYNAMIC_NTK,
    internlm3.DynamicNTKScalingRoPE: _DYNAMIC_NTK,
}


# ---------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------


def rope_refusal(rope) -> Optional[str]:
    """Why ``rope`` cannot rotate tree nodes by depth, or None."""
    kind = type(rope)
    if kind in TREE_ROPES:
        return None
    if kind is TreeRoPE:
        return "a tree verify is already running on this model (reentrant verify)"
    if kind in REFUSED_ROPES:
        return f"{kind.__name__} {REFUSED_ROPES[kind]}"
    return (
        f"{kind.__module__}.{kind.__qualname__} is not a RoPE class known to take "
        f"per-sequence offsets (known: {', '.join(k.__name__ for k in TREE_ROPES)})"
    )


def node_positions(offset, depths: mx.array, batch: int) -> mx.array:
    """``offset + depth`` for every (batch, node), flattened to B*T.

    ``offset`` is whatever the model hands its rope: an int (most models), a
    scalar array (gemma4_text passes ``mx.array(cache.offset)``) or a vector
    of B offsets (batched caches)."""
    if isinstance(offset, mx.array) and offset.ndim == 1:
        return (offset[:, None] + depths[None, :]).reshape(-1)
    pos = depths + offset
    return mx.tile(pos, batch) if batch > 1 else pos


def rope_by_node(rope, x: mx.array, offset, depths: mx.array, **kwargs) -> mx.array:
    """Apply ``rope`` to ``x`` (B, H, T, D) with token t at ``offset + depths[t]``.

    mx.fast.rope takes one offset per batch row, not per token, so tokens move onto the batch axis:
    (B, H, T, D) -> (B*T, H, 1, D) with a vector of B*T offsets. Measured bit-identical to
    per-token rope (docs/verify.md#per-node-rope-positions)."""
    B, H, T, D = x.shape
    if T != depths.size:
        raise RuntimeError(
            f"tree rope got {T} tokens for a tree of {depths.size} nodes: this "
            "model calls its rope on something other than the verify tokens"
        )
    return rope_at(rope, x, node_positions(offset, depths, B), **kwargs)


def rope_at(rope, x: mx.array, positions: mx.array, **kwargs) -> mx.array:
    """``rope`` on ``x`` (B, H, T, D) with token t of batch row b at
    ``positions[b * T + t]``: tokens on the batch axis, one offset each.
    With one batch row (every verify) that is a swap of the batch and token
    axes, one view each way; the rope sees the same values either way."""
    B, H, T, D = x.shape
    if B == 1:
        return rope(x.swapaxes(0, 2), offset=positions, **kwargs).swapaxes(0, 2)
    flat = x.transpose(0, 2, 1, 3).reshape(B * T, H, 1, D)
    out = rope(flat, offset=positions, **kwargs)
    return out.reshape(B, T, H, D).transpose(0, 2, 1, 3)


class TreeRoPE(StandIn):
    """Stands in for an attention module's ``rope`` during one verify forward.

    An nn.Module so that assigning it replaces the child in place (the
    module's key order, hence its parameter tree, is untouched). In any
    thread but the verifying one it is the rope it stands in for: a plain
    forward of the model there sees the model unpatched."""

    def __init__(self, rope, depths: mx.array, positions: Optional[dict] = None):
        super().__init__()
        self.arm(rope, depths, positions)

    def arm(self, rope, depths: mx.array, positions: Optional[dict] = None) -> "TreeRoPE":
        """Stand in for ``rope`` in one forward, with ``depths``: what a new
        stand-in holds, so that an adapter keeps one per rope owner across
        verifies instead of building 32 modules per forward of 32 layers.
        The child where nn.Module's own setattr would store it, the rest as
        plain attributes (not parameters), both past the lookups setattr
        makes first."""
        self["inner"] = rope
        # and as a plain attribute: every call reads it, past nn.Module's
        # __getattr__ (a dict miss first) and the stand-in's
        object.__setattr__(self, "_inner", rope)
        object.__setattr__(self, "_depths", depths)
        # offset -> positions, shared by every rope of one forward (each
        # layer's queries and keys take the same int offset)
        object.__setattr__(self, "_positions", {} if positions is None else positions)
        object.__setattr__(self, "_calls", 0)
        object.__setattr__(self, "_thread", threading.get_ident())
        return self

    def __call__(self, x, offset=0, **kwargs):
        inner = self._inner
        if threading.get_ident() != self._thread:
            return inner(x, offset=offset, **kwargs)
        object.__setattr__(self, "_calls", self._calls + 1)
        if type(offset) is int and x.shape[0] == 1:
            pos = self._positions.get(offset)
            if pos is None:
                pos = self._positions[offset] = self._depths + offset
            return rope_at(inner, x, pos, **kwargs)
        return rope_by_node(inner, x, offset, self._depths, **kwargs)


def rope_owners(model: nn.Module, attr: str = "rope", skip: frozenset = frozenset()) -> list:
    """(name, module) of every module holding a ``rope`` child, in model order
    (names as ``named_modules`` spells them), outside the subtrees of the
    modules whose ids are in ``skip`` (recurrent mixers, which rotate their
    own one token per depth). Walks the module dicts directly (every tree
    verify calls this), which is a few times cheaper than ``named_modules``."""
    found = []

    def visit(name, m):
        if id(m) in skip:
            return
        if attr in m and isinstance(m[attr], nn.Module) and not isinstance(m, TreeRoPE):
            found.append((name, m))
        for key, value in m.items():
            children = (
                [(None, value)] if isinstance(value, nn.Module)  # a Module is a dict
                else value.items() if isinstance(value, dict)
                else enumerate(value) if isinstance(value, (list, tuple))
                else ()
            )
            for sub, child in children:
                if isinstance(child, nn.Module):
                    path = key if sub is None else f"{key}.{sub}"
                    visit(f"{name}.{path}" if name else path, child)

    visit("", model)
    return found


# ---------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------


def tree_mask(
    cache, tree: DraftTree, window_size: Optional[int], start: int = 0, additive: bool = False
) -> mx.array:
    """The mask [n - start, history + n] for this cache's keys after
    the verify update: history keys at positions offset-history..offset-1,
    then the n tree nodes at ``offset + depth``; the rows of nodes
    ``start..n-1`` (nodes before ``start`` are already in the cache, written
    by an earlier verify of the same tree, and counted in its offset). The
    cache's mode says how many keys it keeps and its default window (a
    RotatingKVCache keeps fewer than its offset once wrapped; ``start`` > 0
    is refused on it before anything runs).

    Bool (what a verify injects: mlx-lm's own array masks are bool, and
    some families read the mask as one, e.g. kimi_linear's attention, where
    an additive mask is silently wrong; suites/families catches it), or
    with ``additive`` 0 where a node may attend and the dtype's most
    negative value elsewhere, in the dtype the attention computes in
    (bit-identical to the bool mask through sdpa on the reference BLAS for
    every zoo family and dtype); bool while the cache holds nothing to read
    that dtype from. Built from the topology's cached
    arrays (``DraftTree.derived``), not per round: without a window the mask
    is the tree's ancestry behind ``history`` columns that all attend; with
    one it depends on the history length and the window only (query and key
    positions both count from the same offset), which a wrapped ring keeps
    constant from round to round."""
    mode = mode_of(cache)
    _, history, default_window = mode.key_positions(cache)
    history -= start
    window = window_size or default_window
    dtype = mode.activation_dtype(cache) if additive else None
    if window is None:
        nodes = tree.derived(("ancestry", start, dtype), lambda: _as_mask(
            tree.ancestry()[start:], dtype))
        if not history:
            return nodes
        fill = mx.ones if dtype is None else mx.zeros
        return mx.concatenate([fill((nodes.shape[0], history), dtype=dtype or mx.bool_), nodes],
                              axis=1)
    key = ("window", window, start, dtype)
    kept = tree.derived(key, lambda: [None, None])
    if kept[0] != history:  # one per window: the last history length seen
        kept[:] = history, _as_mask(tree.mask_np(history, window, history)[start:], dtype)
    return kept[1]


def _as_mask(allowed, dtype) -> mx.array:
    if dtype is None:
        return mx.array(allowed)
    return mx.where(mx.array(allowed), mx.array(0, dtype), mx.array(mx.finfo(dtype).min, dtype))


MaskFn = Callable[[object, int, Optional[int]], mx.array]


# ---------------------------------------------------------------------------
# Injection
# ---------------------------------------------------------------------------

_MISSING = object()


def _observed(cache, update):
    """``update`` (a plan's ``update_and_fetch``), still reporting what it is
    fed to an observer already on the cache instance: an ``update_and_fetch``
    with an ``observe`` attribute (treespec.audit.movement.recorded), which
    a plan replaces for the forward but must not blind."""
    observe = getattr(cache.__dict__.get("update_and_fetch"), "observe", None)
    if observe is None:
        return update

    def update_and_fetch(keys, values):
        observe(keys, values)
        return update(keys, values)

    return update_and_fetch


@contextmanager
def injected(
    model: nn.Module,
    caches: Sequence,
    depths: Optional[mx.array],
    mask_fn: MaskFn,
    rope_attr: str = "rope",
    owners: Optional[list] = None,
    positions: Optional[list] = None,
    plans: Optional[dict] = None,
    one_token: Sequence = (),
    rope_pool: Optional[dict] = None,
):
    """For the duration of the block: every attention cache in ``caches``
    answers ``make_mask(N, ...)`` with ``mask_fn(cache, N, window_size)``,
    every ``rope`` in ``model`` rotates token t by ``offset + depths[t]``, and
    every module receiving per-position values (treespec.verify.positions)
    gets them re-indexed by ``depths``, and every attention of ``one_token``
    (``(path, container, key, module)``, treespec.verify.per_node) runs the
    nodes on the batch axis, the ropes inside it handed their positions.
    ``plans`` (cache id -> its mode's verify plan, a ring layout) also
    replace those caches' ``update_and_fetch`` with the plan's.

    ``depths=None`` injects no positions (a chain: its positions are the
    model's own) and replaces only the masks of the caches with a plan, so
    every other layer runs exactly as mlx-lm's plain forward.

    ``depths`` and ``mask_fn`` are explicit (not a tree) so a test can inject
    deliberately wrong positions or masks and watch the exactness suite fail.
    Instance-level only; restored in a ``finally`` even if the forward raises.
    ``owners`` (from :func:`rope_owners`) and ``positions`` (from
    ``position_inputs``) save walking the model again. Yields a probe:
    ``probe()`` raises if the forward bypassed what was injected: no mask
    reached while there are attention caches, no rope reached while there
    are ropes, a position stand-in never reached (a family that computes
    either elsewhere would be silently wrong). Not every rope must run:
    cohere2's global layers hold a rope they never call.
    """
    plans = plans or {}
    ropes = depths is not None
    attention = [c for c in attention_caches(caches) if ropes or id(c) in plans]
    saved = []  # (object, attribute, previous value or _MISSING)
    ropes_put = []  # (owner, its rope): every rope stand-in, whether it runs or not
    wrappers = []
    stand_ins = []
    mask_calls = [0]

    def make_override(cache):
        def make_mask(N, window_size=None, return_array=False, **_):
            mask_calls[0] += 1
            return mask_fn(cache, N, window_size)

        return make_mask

    def instance(obj, attr, value):
        saved.append((obj, attr, obj.__dict__.get(attr, _MISSING)))
        setattr(obj, attr, value)

    try:
        for c in attention:
            instance(c, "make_mask", make_override(c))
            if id(c) in plans:
                instance(c, "update_and_fetch", _observed(c, plans[id(c)].update_and_fetch))
        if ropes:
            if not (isinstance(depths, mx.array) and depths.dtype == mx.int32):
                depths = mx.array(depths, dtype=mx.int32)
            rope_positions = {}  # offset -> node positions, shared by this forward's ropes
            if owners is None:
                owners = rope_owners(model, rope_attr)
            if positions is None:
                positions = position_inputs(model)
            per_token = {id(p[3]): (p[4], p[5]) for p in positions}
            node_steps = {}
            for _, container, key, module in one_token:
                stand_in = NodeSteps(module, depths, per_token.get(id(module)))
                set_slot(container, key, stand_in)
                stand_ins.append((container, key, module, stand_in))
                node_steps[id(module)] = stand_in
            inside = tuple(path for path, *_ in one_token)
            for name, owner in owners:
                if inside and any(name == p or name.startswith(p + ".") for p in inside):
                    continue  # its rope gets the positions from NodeSteps
                kept = None if rope_pool is None else rope_pool.get(id(owner))
                wrapper = (TreeRoPE(owner[rope_attr], depths, rope_positions) if kept is None
                           else kept.arm(owner[rope_attr], depths, rope_positions))
                if rope_pool is not None:
                    rope_pool[id(owner)] = wrapper
                ropes_put.append((owner, owner[rope_attr]))
                set_slot(owner, rope_attr, wrapper)
                wrappers.append(wrapper)
            for path, container, key, module, argument, axis in positions:
                # outside a NodeSteps of the same module: the values are
                # re-indexed by depth first, then laid out per batch row
                stand_in = ByDepth(node_steps.get(id(module), module), depths, argument, axis,
                                   signature=inspect.signature(module.__call__))
                set_slot(container, key, stand_in)
                stand_ins.append((container, key, module, stand_in))

        def probe():
            rope_calls = sum(w._calls for w in wrappers)
            missed = [type(s.inner).__name__ for *_, s in stand_ins if s._calls == 0]
            if attention and (mask_calls[0] == 0 or (wrappers and rope_calls == 0)) or missed:
                raise RuntimeError(
                    f"tree injection bypassed: {rope_calls} rope call(s), "
                    f"{mask_calls[0]} make_mask call(s), position stand-ins never "
                    f"reached: {missed or 'none'}; this family does not route positions "
                    "and masks through self.rope, cache.make_mask and the modules "
                    "treespec.verify.positions re-indexes"
                )

        yield probe
    finally:
        for container, key, module, _ in reversed(stand_ins):
            set_slot(container, key, module)
        for owner, rope in reversed(ropes_put):
            set_slot(owner, rope_attr, rope)
        for obj, attr, prev in reversed(saved):
            if prev is _MISSING:
                obj.__dict__.pop(attr, None)
            else:
                setattr(obj, attr, prev)


@dataclass(frozen=True)
class Sites:
    """Where a model takes its positions, as :func:`tree_injected` injects
    them (the arguments of :func:`injected` of the same names): the rope
    attribute name ``rope_attr``, the ``owners`` of ropes (from
    :func:`rope_owners`), the per-position ``positions`` inputs (from
    ``position_inputs``), the ``one_token`` attentions run with the nodes on
    the batch axis, and the ``rope_pool`` of kept TreeRoPE wrappers. None:
    found by walking the model (owners, positions) or none kept (the pool).
    A model's adapter resolves them once (treespec.verify.adapter)."""

    rope_attr: str = "rope"
    owners: Optional[list] = None
    positions: Optional[list] = None
    one_token: Sequence = ()
    rope_pool: Optional[dict] = None


def tree_injected(
    model: nn.Module,
    caches: Sequence,
    tree: DraftTree,
    sites: Sites = Sites(),
    start: int = 0,
    plans: Optional[dict] = None,
    ropes: bool = True,
    depths=None,
    mask_fn: Optional[MaskFn] = None,
):
    """:func:`injected` with the tree's depths and masks, for a forward over
    the nodes ``start..n-1`` (the cache already holding nodes 0..start-1),
    at the model's ``sites``. The model hands its rope ``cache.offset``,
    which then counts the ``start`` cached nodes too: node i sits at that
    minus start plus depth. A cache with a plan (a ring) takes the plan's
    mask; ``ropes=False`` (a chain) injects no positions. ``depths`` /
    ``mask_fn`` replace the tree's positions (node i's, counted from
    ``start``) or masks: the seams the suites plant defects in."""
    plans = plans or {}
    if depths is None:
        depths = tree.derived(("depths", start), lambda: mx.array(
            tree.depths()[start:] - start, dtype=mx.int32))
    if mask_fn is None:
        mask_fn = lambda cache, N, window: _checked_tree_mask(cache, tree, N, window, start, plans)
    return injected(model, caches, depths if ropes else None, mask_fn, sites.rope_attr,
                    sites.owners, sites.positions, plans, sites.one_token, sites.rope_pool)


def _checked_tree_mask(cache, tree, N, window, start, plans):
    if N != len(tree) - start:
        raise RuntimeError(
            f"make_mask asked for {N} queries, the tree feeds {len(tree) - start}"
        )
    plan = plans.get(id(cache))
    return plan.mask(window) if plan is not None else tree_mask(cache, tree, window, start)
