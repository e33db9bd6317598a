"""One entry per mlx-lm cache mode: everything treespec reads or writes in a cache.

mlx-lm keeps one class per cache mode (``mlx_lm.models.cache``); treespec keeps
one :class:`Mode` per class here, with one small method set, so no other
module asks ``isinstance`` of a cache:

    attention / recurrent     what kind of layer the cache belongs to
    offset(c)                 tokens it has seen (None for a recurrent state)
    verify_refusal(c)         why a tree verify cannot write into it now, or None
    verify_plan(c, tree)      how a verify writes into it when not by the model's own update
    key_positions(c)          (offset, history, default window) a tree mask counts with
    activation_dtype(c)       the dtype an additive tree mask for its attention must have
    grows_in_parts            a drafter may feed a tree in parts and compact in place
    whole_trees_only          a verify must feed a tree in one update
    forks / fork(c, rows)     a copy of it as batch rows (a drafter's branches)
    adopts / adopt(c, f, row) append the rows a forked batch row added
    save(c) / restore(c, s)   put it back exactly as it is now (the drafter, per round)
    snapshot(c)               references to the pre-verify state a commit needs
    hold(c) / put_back(c, h)  a mode's own cheaper hold (see below), or None
    plan_commit(...)          validate a commit of the accepted path: its CommitPlan, or None
    apply(c, plan)            carry that plan out
    trim(c, offset)           (appending caches) keep the first rows: mlx-lm's trim

and ``hold(cache)`` / ``put_back(held)``: every cache as it is now, to undo
a forward that raised (treespec.verify.guard): its mode's own hold where it
has one (an appending cache: its arrays, kept by copy, and its offset),
else every attribute.

Lookup is by exact class (:func:`mode_of`): a subclass may change the layout
these entries rely on, so it gets no entry and is refused by whoever asks.

A commit (what ``treespec.rollback.commit_path`` runs) is, per cache,
:func:`plan_commit` (the checks every mode shares, then its mode's
``plan_commit``: a :class:`CommitPlan`, or None when the cache stays as it
is, or ``RollbackRefused``), then, once every cache is planned and the plans'
reads evaluated, :func:`apply` (its mode's ``apply``). Nothing is written
until every cache has been planned, so a refusal leaves every cache
untouched. Each mode's rollback reads in its class: what it validates, what
its plan holds, how it applies it.

Layout: ``caches.base`` (the method set, its defaults, CommitPlan),
``caches.kv`` (the attention modes) and ``caches.arrays`` (the recurrent
mode), this module (the table, CacheList, and the lookups every other module
uses).
"""

from typing import Dict, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)

from ..rows import Tail
from .kv import (
    Appending,
    Chunked,
    Concatenate,
    Quantized,
    Rotating,
    rotating_kept,
    rotating_present,
)
from .base import CommitPlan, Mode, _copy_array, refuse
from .arrays import Arrays

__all__ = ["MODES", "CommitPlan", "Entry", "Mode", "Tail", "adopt", "adopts", "apply",
           "attention_caches", "fork", "forks", "grows_in_parts", "hold", "holds_recurrent",
           "leaves", "marks", "mode_of", "offset", "offset_of", "plan_commit", "put_back",
           "refuse", "rotating_kept", "rotating_present", "windows", "written"]


class Listed(Mode):
    """CacheList: several caches behind one layer, each by its own entry."""

    def offset(self, c):
        return next((o for o in map(offset_of, c.caches) if o is not None), None)

    def holds_recurrent(self, c):
        return any(mode_of(x).holds_recurrent(x) for x in c.caches)

    def save(self, c):
        return [mode_of(x, required=True).save(x) for x in c.caches]

    def restore(self, c, saved):
        for x, s in zip(c.caches, saved):
            mode_of(x, required=True).restore(x, s)

    def snapshot(self, c):
        return [Entry(x) for x in c.caches]

    def plan_commit(self, c, where, tail, entry, recurrent):
        subs = entry.state if entry is not None else [None] * len(c.caches)
        parts = tuple((s, plan_commit(s, where + (j,), tail, e, recurrent))
                      for j, (s, e) in enumerate(zip(c.caches, subs)))
        reads = tuple(r for _, p in parts if p is not None for r in p.reads)
        return CommitPlan(reads, parts=parts)

    def apply(self, c, plan):
        for s, p in plan.parts:
            apply(s, p)


MODES: Dict[type, Mode] = {
    KVCache: Appending(),
    QuantizedKVCache: Quantized(),
    ChunkedKVCache: Chunked(),
    ConcatenateKVCache: Concatenate(),
    RotatingKVCache: Rotating(),
    ArraysCache: Arrays(),
    CacheList: Listed(),
}
_UNKNOWN = Mode()


def mode_of(c, required: bool = False) -> Mode:
    """The entry for ``c``'s exact class; an unknown class gets the refusing
    default (or, with ``required``, a TypeError naming it)."""
    mode = MODES.get(type(c))
    if mode is None and required:
        raise TypeError(f"no cache mode is known for {type(c).__name__}")
    return mode or _UNKNOWN


def offset_of(c) -> Optional[int]:
    return mode_of(c).offset(c)


def leaves(cache: Sequence) -> list:
    """``(where, cache)`` of every cache in a model's cache list, the entries
    of a CacheList in its place: ``where`` is ``(layer,)`` or ``(layer,
    entry)``."""
    out = []
    for i, c in enumerate(cache):
        if type(c) is CacheList:
            out += [((i, j), s) for j, s in enumerate(c.caches)]
        else:
            out.append(((i,), c))
    return out


def written(c) -> bool:
    return mode_of(c).written(c)


def offset(cache: Sequence) -> Optional[int]:
    """Tokens a model's cache list has seen (the next token's position): the
    offset of its positional entries, None when it has none (a purely
    recurrent model). Raises if they disagree. An attention cache no forward
    ever wrote (a layer that never attends) has no say once another has been
    written."""
    found = [(o, written(c)) for _, c in leaves(cache) for o in [offset_of(c)] if o is not None]
    offsets = {o for o, w in found if w} or {o for o, _ in found}
    if len(offsets) > 1:
        raise ValueError(f"the caches disagree on their offset: {sorted(offsets)}")
    return offsets.pop() if offsets else None


def holds_recurrent(c) -> bool:
    """Whether ``c`` is, or (a CacheList) contains, a recurrent state."""
    return mode_of(c).holds_recurrent(c)


def windows(cache: Sequence) -> list:
    """The sliding windows of a model's caches (one per cache that has one)."""
    return [w for w in (mode_of(c).window(c) for c in cache) if w is not None]


def attention_caches(cache: Sequence) -> list:
    """Every attention cache, CacheList entries included."""
    return [c for _, c in leaves(cache) if mode_of(c).attention]


def grows_in_parts(cache: Sequence) -> bool:
    return all(mode_of(c).grows_in_parts for c in cache)


def forks(cache: Sequence) -> bool:
    """Whether every cache of a model's list can be forked into batch rows."""
    return all(mode_of(c).forks for c in cache)


def fork(cache: Sequence, rows: Sequence[int]) -> list:
    """A model's cache list as ``len(rows)`` batch rows, row i a copy of row
    ``rows[i]`` of every cache (see :func:`forks`); ``cache`` unchanged."""
    return [mode_of(c).fork(c, rows) for c in cache]


def adopts(cache: Sequence) -> bool:
    """Whether every cache of a model's list can adopt a forked row."""
    return all(mode_of(c).adopts for c in cache)


def adopt(cache: Sequence, forked: Sequence, row: int) -> None:
    """Append to every cache the rows batch row ``row`` of its fork (a
    :func:`fork` of the list, fed since) holds past the cache's offset."""
    for c, f in zip(cache, forked):
        mode_of(c).adopt(c, f, row)


class Entry:
    """One cache's pre-verify state: references only, never copies."""

    def __init__(self, c):
        self.cls = type(c)
        self.offset = getattr(c, "offset", None)
        self.state = mode_of(c).snapshot(c)


def plan_commit(c, where, tail: Tail, entry: Optional[Entry], recurrent) -> Optional[CommitPlan]:
    """Validate one cache for this commit (raising RollbackRefused before
    anything is written) and return its plan (None: it stays as it is): the
    checks every mode shares, then its mode's ``plan_commit``."""
    mode = mode_of(c)
    if mode is _UNKNOWN:
        refuse(c, where, "unknown cache class: no exact rollback is known for it")
    if mode.attention and not mode.written(c) and c.offset == 0 and (
            entry is None or entry.offset == 0):
        # No forward ever wrote it, the verify's neither: a layer that never
        # attends (nemotron-nas's no-op attention). Nothing to commit.
        return None
    if entry is not None:
        if entry.cls is not type(c):
            refuse(c, where, f"the snapshot holds a {entry.cls.__name__} here")
        if entry.offset is not None and entry.offset != tail.offset:
            refuse(c, where, f"snapshot offset {entry.offset} is not offset {tail.offset}: "
                   "the snapshot was not taken right before this verify")
    return mode.plan_commit(c, where, tail, entry, recurrent)


def apply(c, plan: Optional[CommitPlan]) -> None:
    """Carry out what :func:`plan_commit` returned for ``c`` (None: nothing)."""
    if plan is not None:
        mode_of(c).apply(c, plan)


def marks(cache: Sequence) -> tuple:
    """What any later update of a model's cache list changes, read without
    touching an array: per cache (CacheList entries included) its identity,
    its offset and ring slot (every mlx-lm update of an attention cache
    advances them), and for a recurrent cache the identity of its slot
    arrays (an update replaces them). A verify's handle keeps these and its
    commit compares them (treespec.verify.adapter.Verified), to refuse a
    commit of caches written since. Not a comparison of contents: a caller
    that moved an offset back by hand and wrote as many rows again in place
    leaves the same marks. Read twice a round, so kept to what an update
    changes (half the cost of also naming the key and value arrays)."""
    return tuple((id(c), getattr(c, "offset", None), getattr(c, "_idx", None),
                  tuple(map(id, c.cache)) if isinstance(c, ArraysCache) else ())
                 for _, c in leaves(cache))


class _Held:
    """One cache object and its attributes as they were (the hold of a mode
    that has none of its own)."""

    __slots__ = ("c", "attrs")

    def __init__(self, c):
        self.c = c
        self.attrs = {k: _held(v) for k, v in vars(c).items()}


def _put_back_held(c, held: _Held) -> None:
    _restored(held)


def _held(v):
    kind = type(v)
    if kind is mx.array:
        return _copy_array(v)
    if kind is int or v is None:
        return v
    if kind is list or kind is tuple:
        return kind(_held(x) for x in v)
    if kind in MODES:  # a CacheList's caches
        return _Held(v)
    return v


def _restored(v):
    if isinstance(v, _Held):
        vars(v.c).clear()
        vars(v.c).update({k: _restored(x) for k, x in v.attrs.items()})
        return v.c
    if type(v) in (list, tuple):
        return type(v)(_restored(x) for x in v)
    return v


def hold(cache: Sequence) -> list:
    """Every cache as it is now, for :func:`put_back`: its mode's own hold
    where it has one (``Mode.hold``: an appending cache's arrays and offset,
    its only state a reader sees), else its attributes.

    All mlx-lm caches keep their whole state in instance attributes (arrays,
    offsets, ring indices, lists of recurrent slots, a CacheList's caches),
    so holding the attributes, arrays by reference to their current values,
    holds the state. Costs no copy; once dropped, nothing of it remains."""
    held = []
    for c in cache:
        mode = mode_of(c)
        own = mode.hold(c)
        # (how to put it back, the cache, what was held): a mode's own, or
        # every attribute
        held.append((_put_back_held, c, _Held(c)) if own is None else (mode.put_back, c, own))
    return held


def put_back(held: list) -> None:
    """Make every held cache what it was when :func:`hold` was called:
    offsets, rings, recurrent slots, and arrays with the values they had
    (whatever was written into them since: while the hold references a
    buffer, no evaluation can reuse it for a write; an appending cache's
    writes past its offset are never read)."""
    for put, c, h in held:
        put(c, h)
