"""The method set every cache mode has (:class:`Mode`: the defaults are a
cache treespec can neither verify into nor roll back), the plan of one
cache's commit (:class:`CommitPlan`), and the checks the modes share."""

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import mlx.core as mx

from ..errors import RollbackRefused
from ..rows import Moved, Tail


# ``copy`` of an mx.array shares its buffer and keeps the value it has now:
# an in-place update (``a[..., i:j, :] = b``, as KVCache and a ring's
# one-token step write) gives the original Python object a new value and
# leaves the copy's alone. No data is copied.
_copy_array = mx.array.__copy__


def kept(v):
    """An attention cache's keys or values (an array, a quantized
    (packed, scales, biases) list, or None) as they are now, through any
    later in-place write."""
    if v is None:
        return None
    kind = type(v)
    return kind(map(_copy_array, v)) if kind is tuple or kind is list else _copy_array(v)


def refuse(c, where, reason):
    raise RollbackRefused(reason, type(c).__name__, where)


def _check_tail(c, where, tail: Tail):
    if c.keys is None:
        refuse(c, where, "the cache is empty: the verify wrote no tree rows into it")
    if c.offset != tail.offset + tail.n:
        refuse(c, where, f"cache offset {c.offset} is not offset {tail.offset} + {tail.n} tree "
               "nodes: the tree rows are not the last rows of this cache")


def _batch_refusal(c) -> Optional[str]:
    if c.keys is None:
        return None
    first = c.keys[0] if isinstance(c.keys, (tuple, list)) else c.keys
    if first.shape[0] != 1:
        return f"{type(c).__name__} holds a batch of {first.shape[0]}; tree verify is batch 1"
    return None


# -- one cache's commit --------------------------------------------------------


@dataclass(eq=False, slots=True)
class CommitPlan:
    """What committing the accepted path does to one cache, decided before
    any cache is written: its mode's ``plan_commit`` validates the cache and
    builds it, its mode's ``apply`` carries it out. The commit
    (treespec.rollback.commit_path) plans every cache first, so a refusal
    leaves every cache untouched, then evaluates every plan's ``reads`` in
    one evaluation, then applies the plans in layer order.

    A mode fills the fields its own ``apply`` reads and leaves the rest at
    their defaults (None: that part does not change)."""

    # Lazy arrays read from the cache's own buffers. Evaluated, every
    # layer's at once, before any write: a write whose buffer still has a
    # pending reader copies the whole buffer instead of writing in place.
    reads: tuple = ()
    offset: Optional[int] = None  # the cache's offset after the commit
    rows: Optional[Moved] = None  # the path's rows that move, and where they go
    end: Optional[int] = None  # stored rows kept once placed, the rest cut off
    idx: Optional[int] = None  # a ring's next write slot after the commit
    arrays: Optional[tuple] = None  # (keys, values) the cache takes whole: a ring laid out anew
    restore: Optional[tuple] = None  # the pre-verify state put back before anything else
    step: Optional[tuple] = None  # after ``restore``: the root's (keys, values), a ring's one-token step
    replay: Any = None  # after ``restore``: how a recurrent state reaches the path's end (arrays.Replay)
    parts: tuple = ()  # a CacheList's entries: (cache, its plan or None), in order


# -- the modes ----------------------------------------------------------------


class Mode:
    """Defaults: a cache treespec can neither verify into nor roll back."""

    attention = False  # a tree mask can replace its make_mask
    recurrent = False  # holds a recurrent layer's state
    grows_in_parts = False
    whole_trees_only = False
    forks = False  # ``fork`` makes batch rows of it
    adopts = False  # ``adopt`` takes a forked row's new rows back

    def offset(self, c) -> Optional[int]:
        return None

    def holds_recurrent(self, c) -> bool:
        return self.recurrent

    def written(self, c) -> bool:
        """Whether any forward ever wrote into it. An attention cache no
        forward writes belongs to a layer that never attends (nemotron-nas's
        no-op and linear attention layers): it has no say in the offset and
        nothing to commit."""
        return True

    def verify_refusal(self, c) -> Optional[str]:
        return f"{type(c).__name__} is not a cache whose mask a tree verify can replace"

    def window(self, c) -> Optional[int]:
        """The sliding window a cache keeps (None: it keeps everything)."""
        return None

    def verify_plan(self, c, tree):
        """How a verify of 2+ nodes writes into this cache, when it does not
        take the model's own update: an object with ``mask(window)`` and
        ``update_and_fetch(keys, values)`` installed on the instance for the
        forward (a RotatingKVCache's ring layout), or None."""
        return None

    def key_positions(self, c):
        """(offset, history, default window) of the keys a tree verify's
        attention sees in front of the nodes."""
        return c.offset, c.offset, None

    def activation_dtype(self, c):
        """The dtype of the queries a verify's attention over this cache
        computes in (that of its stored keys; the scales of quantized ones),
        or None before anything was stored: an additive tree mask must be of
        this dtype to be exact (DESIGN.md)."""
        keys = getattr(c, "keys", None)
        if keys is None:
            return None
        keys = keys[-2] if isinstance(keys, (tuple, list)) else keys  # (packed, scales, biases)
        return keys.dtype if mx.issubdtype(keys.dtype, mx.floating) else None

    def fork(self, c, rows: Sequence[int]):
        """A new cache of ``len(rows)`` batch rows, row i a copy of ``c``'s
        row ``rows[i]`` (a drafter's branches, each one row; ``c`` is left
        as it is). Only where ``forks``."""
        raise TypeError(f"a {type(c).__name__} cannot be forked into batch rows")

    def adopt(self, c, fork, row: int) -> None:
        """Append to ``c`` the rows batch row ``row`` of ``fork`` (a
        :meth:`fork` of ``c``) holds past ``c``'s offset, as a forward over
        them would have written them. Only where ``adopts``."""
        raise TypeError(f"a {type(c).__name__} cannot adopt a forked row")

    def save(self, c):
        raise TypeError(f"the drafter cannot snapshot a {type(c).__name__}")

    def restore(self, c, saved):
        raise TypeError(f"the drafter cannot restore a {type(c).__name__}")

    def snapshot(self, c):
        return None

    def trim(self, c, offset: int) -> None:
        """Keep the first ``offset`` rows in place (an appending cache: the
        commit of a prefix, a drafter's commit)."""
        raise TypeError(f"a {type(c).__name__} cannot be trimmed in place")

    def hold(self, c):
        """A cheaper exact hold of ``c`` than every attribute
        (``treespec.caches.hold``), for :meth:`put_back`; None: hold every
        attribute."""
        return None

    def put_back(self, c, held) -> None:
        raise TypeError(f"{type(self).__name__} has no hold of its own")

    def plan_commit(self, c, where, tail: Tail, entry, recurrent) -> Optional[CommitPlan]:
        """Validate a commit of ``tail.path`` into ``c`` (at ``where``: (layer,)
        or (layer, CacheList entry)), raising RollbackRefused before anything
        is written, and return its plan, or None when the commit leaves
        ``c`` as it is. ``entry``: the pre-verify ``caches.Entry`` of ``c``
        (None without a snapshot); ``recurrent``: the verify's
        ``rollback.Captures`` (None without)."""
        refuse(c, where, "unknown cache class: no exact rollback is known for it")

    def apply(self, c, plan: CommitPlan) -> None:
        """Carry out a plan :meth:`plan_commit` returned for ``c``, after
        every plan's reads were evaluated."""
        raise TypeError(f"no commit is known for a {type(c).__name__}")
