"""Commit the accepted root path of a verified draft tree, in every cache mode.

A verify forward writes all n tree nodes into every cache, in node order, at
``offset .. offset + n - 1``. ``commit_path`` keeps exactly the accepted root
path, compacted to ``offset .. offset + k - 1``, so that each cache equals,
array for array and field for field, the cache of a model that was fed the
history and then only the path as one update of k tokens. Every later update
and mask then behaves as if the other branches had never been drafted.

    snap = snapshot(cache)                        # before the verify forward
    with capture_recurrent_inputs(model) as rec:  # only needed for recurrent layers
        logits = verify(...)
    commit_path(cache, offset, path, tree, snapshot=snap, recurrent=rec)

Every layer is validated before any cache is touched: a commit that cannot be
exact raises ``RollbackRefused`` and leaves every cache as it was.
"""

import inspect
from contextlib import contextmanager
from typing import Any, Callable, List, Optional, Sequence, Union

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from .tree import DraftTree, TreeError


class RollbackRefused(ValueError):
    """A commit that cannot be exact. Raised before any cache is modified.

    ``cache_class`` and ``layer`` name the cache that refused (None when the
    path itself is at fault); ``sub`` is the index inside a CacheList."""

    def __init__(self, reason: str, cache_class: Optional[str] = None, where=()):
        self.reason = reason
        self.cache_class = cache_class
        self.layer = where[0] if where else None
        self.sub = tuple(where[1:])
        at = ""
        if cache_class is not None:
            at = f"{cache_class} at layer {self.layer}"
            at += "".join(f", CacheList entry {j}" for j in self.sub) + ": "
        super().__init__(f"rollback refused: {at}{reason}")


def _refuse(c, where, reason):
    raise RollbackRefused(reason, type(c).__name__, where)


# -- the path ---------------------------------------------------------------


def _parents_of(tree) -> list:
    if isinstance(tree, DraftTree):
        return list(tree.parents)
    try:  # validate a bare parent list exactly as a DraftTree would
        return list(DraftTree([0] * len(tree), tree).parents)
    except TreeError as e:
        raise RollbackRefused(f"malformed tree: {e}") from e


def _root_path(path, parents) -> np.ndarray:
    """The path as int64, checked to be root, parent, child, ... in the tree."""
    n = len(parents)
    nodes = []
    for x in path:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise RollbackRefused(f"path entry {x!r} is not a node index")
        nodes.append(int(x))
    if not nodes or nodes[0] != 0:
        raise RollbackRefused(
            f"path {nodes} does not start at the root: node 0 is always committed"
        )
    for a, b in zip(nodes, nodes[1:]):
        if not 0 <= b < n:
            raise RollbackRefused(f"path node {b} is outside the tree of {n} nodes")
        if parents[b] != a:
            raise RollbackRefused(
                f"path {nodes} is not a root path: the parent of node {b} "
                f"is {parents[b]}, not {a}"
            )
    return np.array(nodes, dtype=np.int64)


class _Tail:
    """The verified tail of one verify forward and the path kept from it."""

    def __init__(self, offset: int, n: int, path: np.ndarray):
        self.offset, self.n, self.path, self.k = offset, n, path, len(path)
        # Rows before the first off-path node already sit in their slot.
        moved = np.nonzero(path != np.arange(self.k))[0]
        self.first_moved = int(moved[0]) if moved.size else self.k


def _gather(x, start: int, tail: _Tail) -> list:
    """The rows ``start + path[i]`` (from the first off-path node on) of one
    array or a quantized (packed, scales, biases) list, still lazy: the rows
    ``_place`` will write. Reading only those makes the cost O(k) rows
    whatever the context length."""
    arrays = list(x) if isinstance(x, (tuple, list)) else [x]
    f = tail.first_moved
    if f == tail.k:
        return []
    idx = mx.array(start + tail.path[f:], dtype=mx.int32)
    return [mx.take(a, idx, axis=2) for a in arrays]


def _place(x, rows: list, start: int, tail: _Tail, owned: bool = True):
    """Write gathered ``rows`` to ``start + first_moved ..`` along the time
    axis (2); returns ``x`` in the same form. ``owned``: the cache allocated
    these arrays, so they are written in place (rows past the path stay as
    they were); otherwise (a first update of a concatenating cache stores
    the caller's array itself) new arrays end after the path."""
    if not rows:
        return x
    arrays = list(x) if isinstance(x, (tuple, list)) else [x]
    f = tail.first_moved
    if owned:
        for a, r in zip(arrays, rows):
            a[..., start + f : start + tail.k, :] = r
    else:
        arrays = [mx.concatenate([a[..., : start + f, :], r], axis=2) for a, r in zip(arrays, rows)]
    return type(x)(arrays) if isinstance(x, (tuple, list)) else arrays[0]


def _move_keys_values(c, start: int, tail: _Tail, owned: bool = True):
    """``(reads, place)`` for the keys and values of an attention cache:
    the rows to move, lazy, and ``place()`` -> the (keys, values) with the
    path's rows at ``start ..``."""
    rows = _gather(c.keys, start, tail), _gather(c.values, start, tail)

    def place():
        return (_place(c.keys, rows[0], start, tail, owned),
                _place(c.values, rows[1], start, tail, owned))

    return rows[0] + rows[1], place


# -- snapshots --------------------------------------------------------------


class _Entry:
    """One cache's pre-verify state: references only, never copies."""

    def __init__(self, cache):
        self.cls = type(cache)
        self.offset = getattr(cache, "offset", None)
        if isinstance(cache, CacheList):
            self.state = [_Entry(c) for c in cache.caches]
        elif type(cache) is ArraysCache:
            # GatedDeltaNet & co. assign new arrays into the slots and never
            # write into the old ones, so the references are a true snapshot.
            self.state = (list(cache.cache), cache.left_padding, cache.lengths)
        elif type(cache) is RotatingKVCache:
            # A multi-token update (_update_concat) builds new arrays, so the
            # pre-verify ring survives a tree of 2+ nodes untouched.
            self.state = (cache.keys, cache.values, cache.offset, cache._idx)
        elif type(cache) is ChunkedKVCache:
            self.state = cache.start_position
        else:
            self.state = None


class Snapshot:
    """``snapshot(cache)``: what a rollback needs from before the verify."""

    def __init__(self, cache: List[Any]):
        self.caches = list(cache)
        self.entries = [_Entry(c) for c in cache]


def snapshot(cache: List[Any]) -> Snapshot:
    """Take before the verify forward. Holds references, copies nothing."""
    return Snapshot(cache)


# -- capturing recurrent inputs ---------------------------------------------


def _holds_recurrent(c) -> bool:
    if isinstance(c, CacheList):
        return any(_holds_recurrent(s) for s in c.caches)
    return isinstance(c, ArraysCache)


class Captures:
    """Recurrent mixer calls seen while capturing: (cache, layer, name, args, kwargs)."""

    def __init__(self):
        self.calls = []
        # Set by a tree-aware recurrence that kept every node's state during
        # the same verify (treespec.verify.gdn_tree.TreeGatedDelta): commit
        # then copies the last path node's state instead of replaying.
        self.tree_states = None

    def calls_for(self, cache) -> list:
        return [call[1:] for call in self.calls if call[0] is cache]


class _Recorder(nn.Module):
    """Stands in for a recurrent mixer: records each call that receives an
    ArraysCache, then runs the module it replaced unchanged."""

    def __init__(self, inner: nn.Module, layer: nn.Module, name: str, captures: Captures):
        super().__init__()
        self.inner = inner
        # Plain attributes, not children: the layer in a tuple would make the
        # module tree a cycle.
        object.__setattr__(self, "_where", (layer, name))
        object.__setattr__(self, "_captures", captures)

    def __getattr__(self, key):
        # Code that reads the mixer's attributes still finds them.
        try:
            return super().__getattr__(key)
        except AttributeError:
            if "inner" not in self:
                raise
            return getattr(self["inner"], key)

    def __call__(self, *args, **kwargs):
        for a in (*args, *kwargs.values()):
            if isinstance(a, ArraysCache):
                self._captures.calls.append((a, *self._where, args, kwargs))
                break
        return self.inner(*args, **kwargs)


def _recurrent_mixers(model: nn.Module):
    """(layer, name, module) of every module that receives a recurrent cache:
    in each layer whose cache is or holds an ArraysCache, the direct children
    whose ``__call__`` takes ``cache``. Found per family: qwen3_5/qwen3_next
    ``linear_attn``, mamba/mamba2/nemotron_h ``mixer``, falcon_h1 ``mamba``."""
    layers = model.layers
    caches = make_prompt_cache(model)
    if len(caches) != len(layers):
        raise RollbackRefused(
            f"cannot match {len(caches)} caches to {len(layers)} layers of "
            f"{type(model).__name__} to find its recurrent mixers"
        )
    for layer, c in zip(layers, caches):
        if not _holds_recurrent(c):
            continue
        for name, child in layer.children().items():
            if isinstance(child, nn.Module) and (
                "cache" in inspect.signature(child.__call__).parameters
            ):
                yield layer, name, child


@contextmanager
def capture_recurrent_inputs(model: nn.Module):
    """Record every recurrent mixer's input during the verify forward.

    Swaps each mixer for a recording stand-in on the instance (the class is
    untouched) and always puts the original back. The replay calls whatever
    module the layer holds at commit time, so this may wrap another
    instance-level stand-in (enter it inside, not around, a verify that swaps
    the mixers itself: a stand-in outside would hide the real mixer's class)."""
    captures = Captures()
    swapped = []
    try:
        for layer, name, child in list(_recurrent_mixers(model)):
            setattr(layer, name, _Recorder(child, layer, name, captures))
            swapped.append((layer, name, child))
        yield captures
    finally:
        for layer, name, child in reversed(swapped):
            setattr(layer, name, child)


# -- per cache mode: validate, then return the mutation ---------------------
#
# A planner checks everything about one cache and returns ``prepare`` (see
# ``_plan``). Nothing is read or mutated until every layer has been planned.


def _check_tail(c, where, tail: _Tail):
    if c.keys is None:
        _refuse(c, where, "the cache is empty: the verify wrote no tree rows into it")
    if c.offset != tail.offset + tail.n:
        _refuse(
            c,
            where,
            f"cache offset {c.offset} is not offset {tail.offset} + {tail.n} tree "
            f"nodes: the tree rows are not the last rows of this cache",
        )


def _plan_appending(c, where, tail, entry, recurrent, start_position=0):
    """KVCache, QuantizedKVCache, ChunkedKVCache: rows in time order in a
    step-allocated buffer; rows past ``offset`` are never read."""
    _check_tail(c, where, tail)
    start = tail.offset - start_position

    def prepare():
        reads, place = _move_keys_values(c, start, tail)

        def write():
            c.keys, c.values = place()
            c.offset = tail.offset + tail.k
            return [c.keys, c.values]

        return reads, write

    return prepare


def _plan_chunked(c, where, tail, entry, recurrent):
    # llama4 builds its chunk mask from flattened row indices, not node
    # depths, so a tree whose rows straddle a chunk boundary was verified
    # against the wrong keys. Within one chunk, depth and row agree on it.
    cs = c.chunk_size
    first, last = tail.offset, tail.offset + tail.n - 1
    if first // cs != last // cs:
        _refuse(
            c,
            where,
            f"the tree's rows {first}..{last} cross a chunk boundary "
            f"(chunk_size {cs}); the chunk mask cannot be exact for it",
        )
    if tail.offset < c.start_position:
        _refuse(c, where, "the tree rows start before the chunk kept in the cache")
    if entry is not None:
        # The forward trims the front once, before its update (llama4 calls
        # maybe_trim_front); a path fed alone would see that same trim.
        start0 = entry.state
        expected = start0 if tail.offset - start0 <= cs else tail.offset - cs
        if c.start_position != expected:
            _refuse(
                c,
                where,
                f"start_position {c.start_position} is not the {expected} one forward "
                "leaves: the tree rows were not written by a single update",
            )
    return _plan_appending(c, where, tail, entry, recurrent, c.start_position)


def _plan_concatenate(c, where, tail, entry, recurrent):
    """ConcatenateKVCache returns its whole arrays, so shorten them: moving
    ``offset`` (what its trim does) would leave the dropped nodes visible."""
    _check_tail(c, where, tail)
    if c.keys.shape[2] != c.offset:
        _refuse(c, where, f"{c.keys.shape[2]} rows stored but offset {c.offset}")

    def prepare():
        # An empty cache stored the caller's arrays as they are: not ours to write.
        reads, place = _move_keys_values(c, tail.offset, tail, owned=tail.offset > 0)

        def write():
            end = tail.offset + tail.k
            keys, values = place()
            c.keys, c.values = keys[..., :end, :], values[..., :end, :]
            c.offset = end
            return [c.keys, c.values]

        return reads, write

    return prepare


def _plan_rotating(c, where, tail, entry, recurrent):
    """RotatingKVCache, before or after the window wrapped.

    A 1-node tree took ``_update_in_place``: the path is that node, nothing
    to do. A tree of n >= 2 took ``_update_concat``, which puts the kept
    history in temporal order, trims it to ``max_size - 1`` rows and appends
    the n nodes: ``_idx == keys.shape[2] == m + n`` with ``m = min(offset,
    max_size - 1)`` (every reachable state keeps at least that much
    history). A k >= 2 path fed alone would leave the same m rows, then the
    path: keep ``m + k`` rows. A 1-node path fed alone takes
    ``_update_in_place`` on the pre-verify ring, which ``_update_concat``
    left untouched: redo that write on it.

    Tree rows written by several updates (a drafter growing its tree) are
    trimmed or rotated differently; that layout is refused, not guessed."""
    _check_tail(c, where, tail)
    if tail.n == 1:
        return _nothing
    m = min(tail.offset, c.max_size - 1)
    if not c._idx == c.keys.shape[2] == m + tail.n:
        _refuse(
            c,
            where,
            f"_idx {c._idx} with {c.keys.shape[2]} rows is not the layout one "
            f"{tail.n}-token update leaves ({m} history rows, then the nodes): "
            "the tree rows were not written by a single update",
        )
    if tail.k >= 2:

        def prepare():
            # An empty cache stored the caller's arrays as they are: not ours to write.
            reads, place = _move_keys_values(c, m, tail, owned=tail.offset > 0)

            def write():
                end = m + tail.k
                keys, values = place()
                c.keys, c.values = keys[..., :end, :], values[..., :end, :]
                c._idx, c.offset = end, tail.offset + tail.k
                return [c.keys, c.values]

            return reads, write

        return prepare

    if entry is None:
        _refuse(
            c,
            where,
            "a root-only path of a multi-node tree must be rewritten into the "
            "pre-verify ring; pass snapshot=snapshot(cache) taken before the verify",
        )
    keys0, values0, offset0, idx0 = entry.state
    if offset0 != tail.offset:
        _refuse(c, where, f"snapshot offset {offset0} is not offset {tail.offset}")

    def prepare():
        root = [c.keys[..., m : m + 1, :], c.values[..., m : m + 1, :]]

        def write():
            c.keys, c.values, c.offset, c._idx = keys0, values0, offset0, idx0
            c._update_in_place(*root)
            return [c.keys, c.values]

        return root, write

    return prepare


def _plan_recurrent(c, where, tail, entry, recurrent):
    """ArraysCache: restore the pre-verify state, then replay the path's
    captured inputs through the layer's own mixer, so the state is the one a
    model that only saw the path would hold."""
    if entry is None or recurrent is None:
        _refuse(
            c,
            where,
            "a recurrent state cannot be rolled back without its pre-verify "
            "snapshot and the captured mixer inputs (pass snapshot= and recurrent=)",
        )
    arrays0, left_padding0, lengths0 = entry.state
    if left_padding0 is not None or lengths0 is not None:
        _refuse(c, where, "batched recurrent caches (left_padding/lengths) are not supported")
    calls = recurrent.calls_for(c)
    if len(calls) != 1:
        _refuse(
            c,
            where,
            f"captured {len(calls)} calls of its mixer, expected exactly the verify's one",
        )
    kept = _kept_states(c, recurrent, tail)
    if kept is not None:
        states, commit_node = kept

        def write_kept():
            c.cache, c.left_padding, c.lengths = list(arrays0), left_padding0, lengths0
            commit_node(c, states, int(tail.path[-1]))
            return [a for a in c.cache if a is not None]

        return lambda: ([], write_kept)
    layer, name, args, kwargs = calls[0]
    module = getattr(layer, name)
    if isinstance(module, _Recorder):
        _refuse(c, where, "commit inside capture_recurrent_inputs: the mixer is still swapped")
    inputs = args[0] if args else None
    if not isinstance(inputs, mx.array) or inputs.ndim < 2 or inputs.shape[1] != tail.n:
        _refuse(c, where, f"the captured mixer input does not hold the {tail.n} tree nodes")

    def replay():
        idx = mx.array(tail.path, dtype=mx.int32)

        def along_path(a):  # activations and masks carry the nodes on axis 1
            if isinstance(a, mx.array) and a.ndim >= 2 and a.shape[1] == tail.n:
                return mx.take(a, idx, axis=1)
            return a

        c.cache, c.left_padding, c.lengths = list(arrays0), left_padding0, lengths0
        module(*map(along_path, args), **{k: along_path(v) for k, v in kwargs.items()})
        return [a for a in c.cache if a is not None]

    return lambda: ([], replay)


def _kept_states(c, recurrent, tail):
    """(states, commit) when the verify kept this layer's per-node states,
    validated now (before anything is written); None means replay."""
    strategy = getattr(recurrent, "tree_states", None)
    if strategy is None or tail.n == 1:
        return None
    try:
        states = strategy.states_for(c)
    except ValueError:
        return None  # this layer's states were not kept: the replay is exact too
    states.node(int(tail.path[-1]))  # raises on a node the tree does not have
    from .verify.gdn_tree import commit

    return states, commit


def _plan_list(c, where, tail, entry, recurrent):
    subs = entry.state if entry is not None else [None] * len(c.caches)
    plans = [
        _plan(s, where + (j,), tail, e, recurrent)
        for j, (s, e) in enumerate(zip(c.caches, subs))
    ]

    def prepare():
        steps = [plan() for plan in plans]
        return [r for reads, _ in steps for r in reads], lambda: [
            a for _, write in steps for a in write()
        ]

    return prepare


_PLANNERS = {
    KVCache: _plan_appending,
    QuantizedKVCache: _plan_appending,
    ChunkedKVCache: _plan_chunked,
    ConcatenateKVCache: _plan_concatenate,
    RotatingKVCache: _plan_rotating,
    ArraysCache: _plan_recurrent,
    CacheList: _plan_list,
}


def _nothing():
    return [], lambda: []


def _plan(c, where, tail, entry, recurrent) -> Callable[[], tuple]:
    """Validate one cache for this commit (raising before anything is
    written) and return its ``prepare``: ``prepare()`` queues the lazy reads
    the commit needs, ``(reads, write)``, and ``write()`` stores the result."""
    # Exact classes only: a subclass may change the layout we rely on.
    planner = _PLANNERS.get(type(c))
    if planner is None:
        _refuse(c, where, "unknown cache class: no exact rollback is known for it")
    if entry is not None:
        if entry.cls is not type(c):
            _refuse(c, where, f"the snapshot holds a {entry.cls.__name__} here")
        if entry.offset is not None and entry.offset != tail.offset:
            _refuse(
                c,
                where,
                f"snapshot offset {entry.offset} is not offset {tail.offset}: "
                f"the snapshot was not taken right before this verify",
            )
    return planner(c, where, tail, entry, recurrent)


def commit_path(
    cache: List[Any],
    offset: int,
    path: Sequence[int],
    tree: Union[DraftTree, Sequence[int]],
    *,
    snapshot: Optional[Snapshot] = None,
    recurrent: Optional[Captures] = None,
) -> int:
    """Keep exactly the accepted ``path`` of the ``tree`` just verified.

    ``cache``: the model's cache list; ``offset``: its length before the
    verify forward, which wrote the ``len(tree)`` nodes at ``offset..`` in
    node order; ``path``: the accepted nodes, a root path (0, child, ...);
    ``tree``: the DraftTree or its parent list. ``snapshot`` (from
    ``snapshot(cache)`` before the verify) and ``recurrent`` (from
    ``capture_recurrent_inputs``) are required for recurrent layers, and
    ``snapshot`` for a root-only path through a RotatingKVCache.

    Returns the number of committed positions. Raises RollbackRefused, with
    every cache untouched, when the commit cannot be exact."""
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)):
        raise RollbackRefused(f"offset {offset!r} is not an integer")
    if offset < 0:
        raise RollbackRefused(f"offset {offset} is negative")
    parents = _parents_of(tree)
    tail = _Tail(int(offset), len(parents), _root_path(path, parents))
    entries = [None] * len(cache)
    if snapshot is not None:
        if len(snapshot.caches) != len(cache):
            raise RollbackRefused(
                f"the snapshot holds {len(snapshot.caches)} caches, the model {len(cache)}"
            )
        for i, (c, c0) in enumerate(zip(cache, snapshot.caches)):
            if c is not c0:
                _refuse(c, (i,), "the snapshot was taken of a different cache object")
        entries = snapshot.entries
    plans = [_plan(c, (i,), tail, e, recurrent) for i, (c, e) in enumerate(zip(cache, entries))]
    if tail.first_moved == tail.k and all(type(c) is KVCache for c in cache):
        # An accepted prefix of the node order (every chain round) on plain
        # KV caches: no row moves and the commit is mlx-lm's trim; the plans
        # above did the checks. Skipping their closures and two evaluations:
        # 16.6 -> 12.2 us per call on the 2-layer zoo llama (this CPU), and
        # no evaluation call at all, which on CUDA may synchronize.
        for c in cache:
            c.offset = tail.offset + tail.k
        return tail.k
    steps = [plan() for plan in plans]
    # Every layer's reads in one sync, before any write: while a read is
    # pending, a slice update cannot reuse its buffer and copies the whole
    # context (30 ms, not 0.2, at 8k); and a sync per layer cost a tree round
    # 3-5 ms of commit on the H200 (16 layers; the chain's trim needs none).
    mx.eval([r for reads, _ in steps for r in reads])
    mx.eval([a for _, write in steps for a in write()])
    return tail.k
