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

How each cache mode commits is its entry in ``treespec.caches`` (its
``plan_commit`` and ``apply``, one class per mode); this module validates the
path, takes snapshots, records recurrent inputs and dispatches: every cache
planned, the plans' reads evaluated together, every plan applied. Every layer
is validated before any cache is touched: a commit that cannot be exact
raises ``RollbackRefused`` and leaves every cache as it was.
"""

import threading
from contextlib import contextmanager
from typing import Any, List, Optional, Protocol, Sequence, Union

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import KVCache

from .caches import Entry, Tail, apply, leaves, mode_of, plan_commit, refuse
from .errors import RollbackRefused, TreeError
from .mixers import Mixer, discover, get_slot, set_slot
from .rows import Written
from .standin import StandIn
from .tree import DraftTree

__all__ = ["Captures", "KeptStates", "RollbackRefused", "Snapshot", "capture_recurrent_inputs",
           "capture_written", "commit_path", "single_updates", "snapshot"]


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


# -- snapshots --------------------------------------------------------------


class Snapshot:
    """``snapshot(cache)``: what a rollback needs from before the verify."""

    def __init__(self, cache: List[Any]):
        self.caches = list(cache)
        self.entries = [Entry(c) for c in cache]


def snapshot(cache: List[Any]) -> Snapshot:
    """Take before the verify forward. Holds references, copies nothing."""
    return Snapshot(cache)


# -- capturing recurrent inputs ---------------------------------------------


class KeptStates(Protocol):
    """Per-node recurrent states a tree-aware recurrence kept during a verify
    (treespec.verify.tree_recurrence.TreeStates): committing a node copies its
    state instead of replaying the path."""

    def node(self, i: int) -> list:
        """Node i's slots; raises IndexError for a node the tree lacks."""

    def write(self, cache_entry, i: int) -> None:
        """Make ``cache_entry`` hold node i's state, as a plain forward over
        its root path would have left it."""


class Captures:
    """Recurrent mixer calls seen while capturing: (cache, layer, name, args,
    kwargs), and the per-node states a tree-aware recurrence kept in the same
    verify (``kept``: cache entry -> KeptStates, by identity)."""

    def __init__(self):
        self.calls = []
        self.kept = []

    def calls_for(self, cache) -> list:
        return [call[1:] for call in self.calls if call[0] is cache]

    def keep(self, cache_entry, states: KeptStates) -> None:
        self.kept.append((cache_entry, states))

    def kept_for(self, cache_entry) -> Optional[KeptStates]:
        return next((s for c, s in self.kept if c is cache_entry), None)

    @staticmethod
    def is_recorder(module) -> bool:
        return isinstance(module, _Recorder)


class _Recorder(StandIn):
    """Stands in for a recurrent mixer: records each call that receives an
    ArraysCache, then runs the module it replaced unchanged. Calls from any
    thread but the one capturing are not recorded (they are another
    forward's)."""

    def __init__(self, inner: nn.Module, container, key, captures: Captures):
        super().__init__()
        self.inner = inner
        # Plain attributes, not children: the container in a tuple would make
        # the module tree a cycle.
        object.__setattr__(self, "_where", (container, key))
        object.__setattr__(self, "_captures", captures)
        object.__setattr__(self, "_thread", threading.get_ident())


    def __call__(self, *args, **kwargs):
        if threading.get_ident() != self._thread:
            return self.inner(*args, **kwargs)
        for a in (*args, *kwargs.values()):
            if mode_of(a).recurrent:
                self._captures.calls.append((a, *self._where, args, kwargs))
                break
        return self.inner(*args, **kwargs)


@contextmanager
def capture_recurrent_inputs(model: nn.Module, mixers: Optional[Sequence[Mixer]] = None):
    """Record every recurrent mixer's input during the verify forward.

    ``mixers``: where they sit (``treespec.mixers.discover(model).mixers``,
    found by that one-token forward when not given). Swaps each for a
    recording stand-in on the instance (the class is untouched) and always
    puts the original back. The replay calls whatever module the slot holds
    at commit time, so this may wrap another instance-level stand-in (enter
    it inside, not around, a verify that swaps the mixers itself: a stand-in
    outside would hide the real mixer's class)."""
    if mixers is None:
        mixers = discover(model).mixers
    captures = Captures()
    swapped = []
    try:
        for m in mixers:
            child = get_slot(m.container, m.key)
            set_slot(m.container, m.key, _Recorder(child, m.container, m.key, captures))
            swapped.append((m.container, m.key, child))
        yield captures
    finally:
        for container, key, child in reversed(swapped):
            set_slot(container, key, child)


# -- capturing what a verify wrote ------------------------------------------

_MISSING = object()


@contextmanager
def capture_written(cache: List[Any]):
    """Record what each plain KVCache of ``cache`` is given to write during
    the block: cache id -> [Written, ...] (treespec.rows), one per update,
    from the capturing thread only, with the array objects the cache holds
    right after that update. A commit that moves rows reads
    them from these (``Tail.written``) instead of from the cache's buffer,
    so it needs no evaluation before its writes (treespec.rows.gather_path),
    but only while the cache still holds those very objects: model code that
    rebinds a cache's arrays after its update (deepseek_v32's indexer stores
    zeros as its values; ``mx.depends`` wrappers) makes the update's input
    not what the cache holds. Wraps ``update_and_fetch`` on the instance,
    whatever it is there (an instrument's stand-in included), and always
    puts back what was there. (treespec.audit.movement.recorded records
    updates too, on its own: it is the independent check of what a commit
    keeps, so it does not share this mechanism.)"""
    written = {}
    thread = threading.get_ident()
    saved = []

    def recording(c, update):
        def update_and_fetch(keys, values):
            out = update(keys, values)
            if threading.get_ident() == thread:
                written.setdefault(id(c), []).append(Written(keys, values, c.keys, c.values))
            return out
        return update_and_fetch

    try:
        for _, c in leaves(cache):
            if type(c) is KVCache:
                saved.append((c, c.__dict__.get("update_and_fetch", _MISSING)))
                c.update_and_fetch = recording(c, c.update_and_fetch)
        yield written
    finally:
        for c, prev in reversed(saved):
            if prev is _MISSING:
                del c.update_and_fetch
            else:
                c.update_and_fetch = prev


def single_updates(written: dict) -> dict:
    """cache id -> what :func:`capture_written` recorded of the caches
    written by exactly one update: only then does row i hold node i."""
    return {k: v[0] for k, v in written.items() if len(v) == 1}


# -- the commit -------------------------------------------------------------


def commit_path(
    cache: List[Any],
    offset: int,
    path: Sequence[int],
    tree: Union[DraftTree, Sequence[int]],
    *,
    snapshot: Optional[Snapshot] = None,
    recurrent: Optional[Captures] = None,
    written: Optional[dict] = None,
) -> int:
    """Keep exactly the accepted ``path`` of the ``tree`` just verified.

    ``cache``: the model's cache list; ``offset``: its length before the
    verify forward, which wrote the ``len(tree)`` nodes at ``offset..`` in
    node order; ``path``: the accepted nodes, a root path (0, child, ...);
    ``tree``: the DraftTree or its parent list. ``snapshot`` (from
    ``snapshot(cache)`` before the verify) and ``recurrent`` (from
    ``capture_recurrent_inputs``) are required for recurrent layers, and
    ``snapshot`` for a root-only path through a RotatingKVCache.
    ``written`` (``single_updates`` of ``capture_written`` around the verify)
    is where moved rows of those caches are read from: then the commit
    evaluates nothing and its writes join the next forward's graph.

    Returns the number of committed positions. Raises RollbackRefused, with
    every cache untouched, when the commit cannot be exact."""
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)):
        raise RollbackRefused(f"offset {offset!r} is not an integer")
    if offset < 0:
        raise RollbackRefused(f"offset {offset} is negative")
    parents = _parents_of(tree)
    tail = Tail(int(offset), parents, _root_path(path, parents), written)
    entries = [None] * len(cache)
    if snapshot is not None:
        if len(snapshot.caches) != len(cache):
            raise RollbackRefused(
                f"the snapshot holds {len(snapshot.caches)} caches, the model {len(cache)}"
            )
        for i, (c, c0) in enumerate(zip(cache, snapshot.caches)):
            if c is not c0:
                refuse(c, (i,), "the snapshot was taken of a different cache object")
        entries = snapshot.entries
    # Every cache validated and planned before any is written. A path that
    # is a prefix of the node order on plain KV caches (every chain round,
    # and every tree round accepting first choices) plans a trim
    # (caches.kv.Appending.trim): nothing to read, no evaluation.
    plans = [plan_commit(c, (i,), tail, e, recurrent) for i, (c, e) in enumerate(zip(cache, entries))]
    # Reads that alias a cache's buffer (rows not captured from the verify's
    # own update: other cache modes, a tree fed in parts) in one evaluation,
    # before any write: while such a read is pending, a slice update cannot
    # reuse its buffer and copies the whole context (measured: the peak
    # memory of one evaluation of both is the cache's size); one evaluation
    # per layer would synchronize once per layer. The writes stay lazy: the
    # next forward evaluates them, each in place (its buffer has no other
    # reader left), so a commit synchronizes once when such rows move and
    # not at all otherwise.
    reads = [r for plan in plans if plan is not None for r in plan.reads]
    if reads:
        mx.eval(reads)
    for c, plan in zip(cache, plans):
        apply(c, plan)
    return tail.k
