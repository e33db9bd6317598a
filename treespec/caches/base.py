"""The method set every cache mode has (:class:`Mode`: the defaults are a
cache treespec can neither verify into nor roll back), and the checks the
modes share."""

from typing import Optional, Sequence

import mlx.core as mx

from ..errors import RollbackRefused
from ..rows import Tail


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


def _nothing():
    return [], lambda: []


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

    def hold(self, c):
        """A cheaper exact hold of ``c`` than every attribute
        (``treespec.caches.hold``), for :meth:`put_back`; None: hold every
        attribute."""
        return None

    def put_back(self, c, held) -> None:
        raise TypeError(f"{type(self).__name__} has no hold of its own")

    def plan_commit(self, c, where, tail: Tail, entry, recurrent):
        refuse(c, where, "unknown cache class: no exact rollback is known for it")
