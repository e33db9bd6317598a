"""Moving cache rows along the time axis (2): the accepted path of a verified
tree gathered from where the verify wrote it and placed where a forward over
the path alone would have written it. Lazy mx ops; a cache mode
(treespec.caches) decides where its rows start and whether it owns them."""

import mlx.core as mx
import numpy as np


class Tail:
    """The verified tail of one verify forward and the root path kept from it:
    the forward wrote the ``n = len(parents)`` nodes of a tree at ``offset ..``;
    ``path`` (int64, starting at the root 0) is what stays, compacted to
    ``offset .. offset + k - 1``."""

    def __init__(self, offset: int, parents, path: np.ndarray):
        self.offset, self.path, self.k = offset, path, len(path)
        self.parents = list(parents)
        self.n = len(self.parents)
        depths = np.zeros(self.n, dtype=np.int64)
        for i in range(1, self.n):
            depths[i] = depths[self.parents[i]] + 1
        self.depths = depths
        # Rows before the first off-path node already sit in their slot.
        self.first_moved = next((i for i, p in enumerate(path.tolist()) if p != i), self.k)


# -- moving rows along the time axis (2) -------------------------------------


def _arrays(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def gather_rows(x, start: int, tail: Tail) -> list:
    """The rows ``start + path[i]`` (from the first off-path node on) of one
    array or a quantized (packed, scales, biases) triple, still lazy: the rows
    :func:`place_rows` will write. Reading only those keeps a commit O(k) rows
    whatever the context length."""
    f = tail.first_moved
    if f == tail.k:
        return []
    idx = mx.array(start + tail.path[f:], dtype=mx.int32)
    return [mx.take(a, idx, axis=2) for a in _arrays(x)]


def place_rows(x, rows: list, start: int, tail: Tail, owned: bool = True):
    """Write gathered ``rows`` to ``start + first_moved ..``; returns ``x`` in
    the same form. ``owned``: the cache allocated these arrays, so they are
    written in place (rows past the path stay as they were); otherwise (a
    first update of a concatenating cache stores the caller's array itself)
    new arrays end after the path."""
    if not rows:
        return x
    arrays = _arrays(x)
    f = tail.first_moved
    if owned:
        for a, r in zip(arrays, rows):
            a[..., start + f : start + tail.k, :] = r
    else:
        arrays = [mx.concatenate([a[..., : start + f, :], r], axis=2) for a, r in zip(arrays, rows)]
    return type(x)(arrays) if isinstance(x, (tuple, list)) else arrays[0]


def move_keys_values(c, start: int, tail: Tail, owned: bool = True):
    """``(reads, place)`` for the keys and values of an attention cache: the
    rows to move, lazy, and ``place()`` -> (keys, values) with the path's rows
    at ``start ..``."""
    rows = gather_rows(c.keys, start, tail), gather_rows(c.values, start, tail)

    def place():
        return (place_rows(c.keys, rows[0], start, tail, owned),
                place_rows(c.values, rows[1], start, tail, owned))

    return rows[0] + rows[1], place
