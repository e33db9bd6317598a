"""Moving cache rows along the time axis (2): the accepted path of a verified
tree gathered from where the verify wrote it and placed where a forward over
the path alone would have written it. Lazy mx ops; a cache mode
(treespec.caches) decides where its rows start and whether it owns them."""

from typing import NamedTuple

import mlx.core as mx
import numpy as np

from .tree import consecutive


class Written(NamedTuple):
    """What one update of a verify gave a cache to write (node i at row i),
    and the arrays the cache held right after it
    (treespec.rollback.capture_written)."""

    keys: mx.array
    values: mx.array
    cache_keys: mx.array
    cache_values: mx.array

    def holds(self, c) -> bool:
        """Whether ``c`` still holds what that update left (no model code
        rebound its arrays since)."""
        return self.cache_keys is c.keys and self.cache_values is c.values


class Tail:
    """The verified tail of one verify forward and the root path kept from it:
    the forward wrote the ``n = len(parents)`` nodes of a tree at ``offset ..``;
    ``path`` (int64, starting at the root 0) is what stays, compacted to
    ``offset .. offset + k - 1``."""

    def __init__(self, offset: int, parents, path: np.ndarray, written=None):
        self.offset, self.path, self.k = offset, path, len(path)
        # cache id -> the Written of the verify's one update of that cache:
        # where the moved rows are read from while the cache holds what it
        # left, so that no read aliases a cache's buffer.
        self.written = written or {}
        self._index = {}
        self.parents = list(parents)
        self.n = len(self.parents)
        depths = np.zeros(self.n, dtype=np.int64)
        for i in range(1, self.n):
            depths[i] = depths[self.parents[i]] + 1
        self.depths = depths
        # Rows before the first off-path node already sit in their slot.
        nodes = path.tolist()
        self.first_moved = next((i for i, p in enumerate(nodes) if p != i), self.k)
        # The moved nodes as one slice of the verified block when they are
        # consecutive there: in first-choice order (treespec.tree) a branch
        # that follows first choices below where it left the first-choice path
        # is, and a slice reads them with no gather.
        self.run = consecutive(nodes[self.first_moved:])

    def index(self, start: int) -> mx.array:
        """The rows ``start + path[first_moved:]``, one device array per start
        for every layer of the commit (not one host-to-device copy each)."""
        if start not in self._index:
            self._index[start] = mx.array(start + self.path[self.first_moved:], dtype=mx.int32)
        return self._index[start]


# -- moving rows along the time axis (2) -------------------------------------


def _arrays(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def gather_rows(x, start: int, tail: Tail, view: bool = False) -> list:
    """The rows ``start + path[i]`` (from the first off-path node on) of one
    array or a quantized (packed, scales, biases) triple, still lazy: the rows
    :func:`place_rows` will write. Reading only those keeps a commit O(k) rows
    whatever the context length. ``view``: ``x`` is not the array the rows
    are written to, so consecutive rows may be read as a slice of it (no
    gather; a slice of the destination's own buffer would keep that buffer
    from being written in place)."""
    if tail.first_moved == tail.k:
        return []
    if view and tail.run is not None:
        rows = slice(start + tail.run.start, start + tail.run.stop)
        return [a[..., rows, :] for a in _arrays(x)]
    idx = tail.index(start)
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


class Moved(NamedTuple):
    """The accepted path's rows of one attention cache, read (lazily) but not
    yet placed: :func:`gather_path` reads them, :meth:`place` writes them.
    Between the two, the commit evaluates every layer's ``reads`` at once
    (treespec.rollback.commit_path)."""

    keys: list  # the moved key rows: one array, or those of a quantized (packed, scales, biases)
    values: list
    start: int  # the stored row of the path's root: row i of the path goes to start + i
    owned: bool  # the cache allocated its arrays: the rows are written into them in place
    tail: Tail
    # Those of ``keys`` and ``values`` that alias the cache's own arrays: to
    # be evaluated before any write, else a write could not reuse the buffer
    # and would copy it whole. Empty when read from what the verify wrote.
    reads: tuple

    def place(self, c):
        """(keys, values) of ``c`` with the path's rows at ``start ..``."""
        return (place_rows(c.keys, self.keys, self.start, self.tail, self.owned),
                place_rows(c.values, self.values, self.start, self.tail, self.owned))


def gather_path(c, start: int, tail: Tail, owned: bool = True) -> Moved:
    """The rows of the path that move, for the keys and values of an
    attention cache whose path root is stored at row ``start``. Where the
    verify's one update of this cache was captured (``tail.written``) and the
    cache holds what that update left (no model code rebound its arrays
    since), the rows are read from what it wrote: nothing aliases the
    buffer, nothing needs evaluating first, and the writes take the buffer
    in place when the next forward evaluates them. Else they are read from
    the cache's arrays, and listed in ``reads``."""
    src = tail.written.get(id(c))
    if owned and src is not None and src.holds(c) and src.keys.shape[2] == tail.n:
        keys = gather_rows(src.keys, 0, tail, view=True)
        values = gather_rows(src.values, 0, tail, view=True)
        return Moved(keys, values, start, owned, tail, ())
    keys, values = gather_rows(c.keys, start, tail), gather_rows(c.values, start, tail)
    return Moved(keys, values, start, owned, tail, tuple(keys + values))
