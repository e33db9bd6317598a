"""Rollback as data movement, exact on every backend.

A commit computes nothing: it keeps rows (and recurrent states) that the
verify forward already wrote. So whatever the backend's numerics, after
committing a path every cache must hold, bit for bit, what the verify itself
wrote for the path's nodes:

- an attention cache equals a copy of its pre-verify self fed the verify's
  own key/value rows of the path one at a time, as classic decoding writes
  them (mlx-lm's ``update_and_fetch`` does the layout, the quantization, the
  ring: on a sliding window each row is a one-token step's in-place write);
- a recurrent state kept per node by the tree-aware recurrence equals the
  kept state of the path's last node;
- a recurrent state the commit replays equals an independent replay of the
  verify's captured mixer inputs along the path, from the pre-verify state.

This is the backend-independent half of contract 7; "decoding on gives the
logits of a cache that only saw the path" is the numeric half (bit for bit
where the backend is exact, within its envelope elsewhere).

    pre = clone(cache)
    with recorded(cache) as writes:
        verified = adapter.verify_handle(tree, cache)
    adapter.commit(cache, tree, path, verified=verified)
    expected = moved(pre, writes, path, len(tree), verified.captures, cache)
    mismatches(cache, expected)  # [] or what differs, per layer and field
"""

from contextlib import contextmanager
from typing import Dict, List, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, CacheList, RotatingKVCache

from ..caches import mode_of


def _leaves(cache, where=()) -> list:
    """(index path, cache) of every leaf cache (CacheList flattened)."""
    out = []
    for i, c in enumerate(cache):
        if isinstance(c, CacheList):
            out += _leaves(c.caches, where + (i,))
        else:
            out.append((where + (i,), c))
    return out


@contextmanager
def recorded(cache):
    """Record the (keys, values) every attention cache's update receives
    during the block (an instance attribute around the class's method,
    removed on exit). Yields {index path: [(keys, values), ...]}."""
    writes: Dict[tuple, list] = {}
    wrapped = []
    try:
        for where, c in _leaves(cache):
            if not mode_of(c).attention:
                continue
            inner = c.update_and_fetch
            calls = writes.setdefault(where, [])

            def update_and_fetch(keys, values, _inner=inner, _calls=calls):
                _calls.append((keys, values))
                return _inner(keys, values)

            # A verify that lays a ring out itself replaces update_and_fetch
            # for its forward and reports what it is fed here
            # (treespec.verify.attention).
            update_and_fetch.observe = lambda keys, values, _calls=calls: _calls.append((keys, values))
            c.update_and_fetch = update_and_fetch
            wrapped.append(c)
        yield writes
    finally:
        for c in wrapped:
            c.__dict__.pop("update_and_fetch", None)


def _along(a, idx, n):
    """Activations and masks carry the tree's nodes on axis 1."""
    if isinstance(a, mx.array) and a.ndim >= 2 and a.shape[1] == n:
        return mx.take(a, idx, axis=1)
    return a


def moved(pre: Sequence, writes: Dict[tuple, list], path: Sequence[int], n: int,
          captures=None, committed: Optional[Sequence] = None) -> List:
    """The cache a commit of ``path`` must leave: ``pre`` (an independent
    copy of the pre-verify cache, consumed) with every attention leaf fed the
    verify's recorded rows of the path one at a time, and every recurrent
    leaf at its kept state (or an independent replay of the captured inputs).
    ``committed``: the committed cache, whose leaves key ``captures``. A
    recurrent leaf without ``captures`` (an adapter that does not expose
    them) is set to None: :func:`mismatches` reports it as unchecked."""
    idx = mx.array(list(path), dtype=mx.int32)
    leaves = dict(_leaves(pre))
    live = dict(_leaves(committed)) if committed is not None else {}
    for where, c in leaves.items():
        if mode_of(c).attention:
            calls = writes.get(where, [])
            if not calls:  # a layer the verify never updated (nemotron-nas's no-op
                continue  # attention blocks) must keep what it held
            if len(calls) != 1:
                raise ValueError(f"layer {where}: the verify updated it {len(calls)} times, not once")
            keys, values = calls[0]
            # The path's rows one at a time, as classic decoding writes them:
            # on a ring each is the in-place write of a one-token step (the
            # slots the ring verify commits into); elsewhere the same rows as
            # one update of k.
            for j in list(path):
                c.update_and_fetch(keys[:, :, j : j + 1], values[:, :, j : j + 1])
        elif isinstance(c, ArraysCache):
            if captures is None:
                c.cache = None
            else:
                c.cache = _recurrent_expected(c, live.get(where), captures, idx, n)
    mx.eval([x for _, c in leaves.items() for x in _arrays(c)])
    return pre


def _recurrent_expected(c, live, captures, idx, n) -> list:
    kept = captures.kept_for(live) if (live is not None and n > 1) else None
    if kept is not None:
        return [mx.array(a) if a is not None else None for a in kept.node(int(idx[-1].item()))]
    calls = captures.calls_for(live) if live is not None else []
    if len(calls) != 1:
        raise ValueError(f"{len(calls)} captured mixer calls for a recurrent layer, expected 1")
    layer, name, args, kwargs = calls[0]
    module = getattr(layer, name)
    swap = lambda a: c if a is live else _along(a, idx, n)
    module(*map(swap, args), **{k: swap(v) for k, v in kwargs.items()})
    return list(c.cache)


def _arrays(c) -> list:
    if isinstance(c, ArraysCache):
        return [a for a in c.cache or () if a is not None]
    out = []
    for a in (getattr(c, "keys", None), getattr(c, "values", None)):
        out += list(a) if isinstance(a, (list, tuple)) else [a] if a is not None else []
    return out


def _fields(c) -> dict:
    """Everything of a leaf a later update, mask or attention reads: the
    valid rows (a ring's whole buffer) and every counter."""
    if isinstance(c, ArraysCache):
        return {f"slot{i}": a for i, a in enumerate(c.cache)}
    out = {"offset": c.offset}
    if isinstance(c, RotatingKVCache):
        # What the next step reads and where it writes: the rows the ring
        # hands its attention (slot order) and the write slot; rows past the
        # offset (a buffer grown ahead) are never read.
        out.update(_idx=c._idx, keep=c.keep, max_size=c.max_size)
        if c.keys is not None:
            out["keys0"], out["values0"] = c.keys_and_values()
        return out
    end = c.offset - getattr(c, "start_position", 0)
    for name in ("keys", "values"):
        x = getattr(c, name)
        parts = list(x) if isinstance(x, (list, tuple)) else [x]
        for j, a in enumerate(parts):
            out[f"{name}{j}"] = a if a is None else a[..., :end, :]
    return out


def mismatches(cache: Sequence, expected: Sequence) -> List[str]:
    """What differs between a committed cache and :func:`moved`'s, bit for
    bit, per layer and field ([] when nothing does). Raises if a layer could
    not be checked (a recurrent state without its captures)."""
    out = []
    for (where, a), (_, b) in zip(_leaves(cache), _leaves(expected)):
        if isinstance(b, ArraysCache) and b.cache is None:
            raise ValueError(f"layer {where}: no captured recurrent inputs to check it with")
        if type(a) is not type(b):
            out.append(f"layer {where}: {type(a).__name__} vs {type(b).__name__}")
            continue
        fa, fb = _fields(a), _fields(b)
        for k in fa:
            x, y = fa[k], fb.get(k)
            if isinstance(x, mx.array) or isinstance(y, mx.array):
                same = (isinstance(x, mx.array) and isinstance(y, mx.array)
                        and x.shape == y.shape and x.dtype == y.dtype and mx.array_equal(x, y).item())
            else:
                same = x == y
            if not same:
                out.append(f"layer {where} ({type(a).__name__}) {k}")
    return out
