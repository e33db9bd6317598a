"""Which modules of a model take a recurrent cache, found by watching one forward.

A recurrent layer keeps its state in an ``ArraysCache`` (conv windows, SSM or
delta-rule states, token shifts, n-gram contexts). The module that receives
that cache, the *mixer*, sits in different places in each family: a decoder
layer's ``linear_attn``, ``mixer``, ``mamba``, ``conv``, ``temporal_block`` or
``attention``, two modules sharing one cache (rwkv7's time and channel
mixing), or the embedding (longcat_flash_ngram's n-gram context); and cache
lists need not line up with ``model.layers`` (nemotron_h makes no cache for
its MLP layers). So instead of a table of names, :func:`discover` runs the
model once on a few tokens with a scratch ``make_prompt_cache`` and records
every module whose ``__call__`` takes ``cache`` and is handed an
``ArraysCache``; the mixers are the innermost of them (a decoder layer passes
the cache on to its mixer). The same run (over a few tokens, so that a slot
that grows with the history, longcat's n-gram context, has reached its
size) gives each cache's slot shapes and dtypes, hence the per-node memory
a tree-aware recurrence keeps.

An ``ArraysCache`` that no module receives on its own (it reaches a module
only inside a ``CacheList``, with an attention cache) belongs to an attention
that keeps a recurrent state of its own (baichuan_m1 convolves its keys and
values): :func:`discover` names it in ``refusal``.

    slots(model)     (path, container, key, module) of every submodule, where
                     container[key] (a module attribute or a list entry) holds it
    discover(model)  Discovery: mixers, per-cache slot shapes, refusal
"""

import inspect
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, CacheList, make_prompt_cache

from .standin import StandIn

__all__ = ["Discovery", "Mixer", "discover", "get_slot", "set_slot", "slots", "takes_cache"]


def get_slot(container, key):
    return container[key]


def set_slot(container, key, module) -> None:
    """Put ``module`` where ``container[key]`` is: a module's attribute (so
    its parameter tree keeps its key order) or a list entry. A module's child
    is a dict entry of its parent, where nn.Module's setattr ends up putting
    one; set there directly, skipping the attribute lookups that setattr
    makes first (every tree verify swaps a stand-in into every layer)."""
    if isinstance(container, nn.Module) and key not in container:
        setattr(container, key, module)
    else:
        container[key] = module


def slots(model: nn.Module) -> List[Tuple[str, Any, Any, nn.Module]]:
    """``(path, container, key, module)`` of every submodule of ``model``, in
    model order, each once (a module reachable twice is listed at its first
    path)."""
    out, seen = [], set()

    def visit(prefix, module):
        for key, value in module.items():
            if isinstance(value, nn.Module):
                children = [(key, module, key, value)]
            elif isinstance(value, (list, tuple)):
                children = [(f"{key}.{i}", value, i, v) for i, v in enumerate(value)
                            if isinstance(v, nn.Module)]
                if isinstance(value, tuple):
                    children = [(p, None, None, v) for p, _, _, v in children]
            elif isinstance(value, dict):
                children = [(f"{key}.{k}", value, k, v) for k, v in value.items()
                            if isinstance(v, nn.Module)]
            else:
                children = []
            for path, container, k, child in children:
                if id(child) in seen:
                    continue
                seen.add(id(child))
                full = f"{prefix}.{path}" if prefix else path
                out.append((full, container, k, child))
                visit(full, child)

    visit("", model)
    return out


def takes_cache(module) -> bool:
    try:
        return "cache" in inspect.signature(module.__call__).parameters
    except (AttributeError, TypeError, ValueError):
        return False


@dataclass
class Mixer:
    """A module that receives an ArraysCache: where it sits and what it got."""

    path: str
    container: Any
    key: Any
    module: nn.Module
    where: Tuple[int, ...]  # the cache it receives: (layer,) or (layer, CacheList entry)

    def current(self) -> nn.Module:
        return get_slot(self.container, self.key)


@dataclass
class Discovery:
    mixers: List[Mixer] = field(default_factory=list)
    # per recurrent cache (by where): [(shape without the batch axis, dtype)] per slot
    slot_shapes: Dict[Tuple[int, ...], List[Optional[Tuple[tuple, Any]]]] = field(default_factory=dict)
    refusal: Optional[str] = None

    def bytes_per_node(self) -> Dict[Tuple[int, ...], int]:
        """Bytes one node's state takes in each recurrent cache."""
        out = {}
        for where, shapes in self.slot_shapes.items():
            total = 0
            for s in shapes:
                if s is not None:
                    shape, dtype = s
                    n = 1
                    for d in shape:
                        n *= d
                    total += n * dtype.size
            out[where] = total
        return out


def _recurrent_leaves(cache) -> Dict[int, Tuple[int, ...]]:
    """id(ArraysCache) -> where, for every ArraysCache in a cache list."""
    found = {}
    for i, c in enumerate(cache):
        if type(c) is ArraysCache:
            found[id(c)] = (i,)
        elif type(c) is CacheList:
            for j, s in enumerate(c.caches):
                if type(s) is ArraysCache:
                    found[id(s)] = (i, j)
    return found


class _Watch(StandIn):
    """Records which caches a module is handed, then runs it unchanged."""

    def __init__(self, inner, path, seen):
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_seen", seen)


    def __call__(self, *args, **kwargs):
        for a in (*args, *kwargs.values()):
            if isinstance(a, (ArraysCache, CacheList)):
                self._seen.append((self._path, a))
        return self.inner(*args, **kwargs)


# Tokens of the scratch forward: more than any mlx-lm slot grows by (conv
# windows are K - 1 <= 4, longcat's n-gram context n - 1 <= 4).
SCRATCH_TOKENS = 8


def discover(model: nn.Module) -> Discovery:
    """The model's recurrent mixers and cache slot shapes, from one forward
    over SCRATCH_TOKENS tokens on a scratch cache (nothing of the model or
    any real cache is touched). A model without an ArraysCache is not run."""
    scratch = make_prompt_cache(model)
    leaves = _recurrent_leaves(scratch)
    if not leaves:
        return Discovery()
    listed = {id(c): c for c in scratch if type(c) is CacheList}
    watched = [s for s in slots(model) if s[1] is not None and takes_cache(s[3])]
    seen: list = []
    swapped = []
    try:
        for path, container, key, module in watched:
            set_slot(container, key, _Watch(module, path, seen))
            swapped.append((container, key, module))
        out = model(mx.zeros((1, SCRATCH_TOKENS), dtype=mx.int32), cache=scratch)
        mx.eval(out)
    finally:
        for container, key, module in reversed(swapped):
            set_slot(container, key, module)
    modules = {path: (container, key, module) for path, container, key, module in watched}
    found = Discovery()
    by_cache: Dict[int, List[str]] = {}
    for path, c in seen:
        if id(c) in leaves:
            by_cache.setdefault(id(c), [])
            if path not in by_cache[id(c)]:
                by_cache[id(c)].append(path)
    for cid, where in leaves.items():
        paths = by_cache.get(cid, [])
        # Innermost receivers: a decoder layer hands the cache to its mixer.
        inner = [p for p in paths if not any(q != p and q.startswith(p + ".") for q in paths)]
        if not inner:
            holder = next((p for p, c in seen if type(c) is CacheList and id(c) in listed
                           and any(id(s) == cid for s in c.caches)), None)
            what = f"the CacheList at layer {where[0]}"
            if holder is not None:
                cls = type(modules[holder][2])
                found.refusal = found.refusal or (
                    f"{holder} ({cls.__module__}.{cls.__qualname__}) takes {what} whole, an "
                    "ArraysCache with its attention cache: an attention that keeps a "
                    "recurrent state of its own (a convolution over its keys and values), "
                    "not a mixer whose per-node state a tree verify can keep")
            else:
                found.refusal = found.refusal or (
                    f"no module receives the ArraysCache at layer {'.'.join(map(str, where))}")
            continue
        for p in inner:
            container, key, module = modules[p]
            found.mixers.append(Mixer(p, container, key, module, where))
        arrays = next(c for c in _all_arrays(scratch) if id(c) == cid).cache
        found.slot_shapes[where] = [None if s is None else (tuple(s.shape[1:]), s.dtype)
                                    for s in arrays]
    found.mixers.sort(key=lambda m: m.where)
    return found


def _all_arrays(cache):
    for c in cache:
        if type(c) is ArraysCache:
            yield c
        elif type(c) is CacheList:
            yield from (s for s in c.caches if type(s) is ArraysCache)
