"""The attention cache modes: KVCache and QuantizedKVCache (appending),
ChunkedKVCache, ConcatenateKVCache and RotatingKVCache."""

import copy
from itertools import groupby

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import RotatingKVCache

from ..errors import TreeRefused
from ..ring import Ring, committed, layout, ring_of
from ..rows import gather_path
from .base import CommitPlan, Mode, _batch_refusal, _check_tail, kept, refuse


def _take_rows(v, rows):
    """Keys or values (an array, or a quantized (packed, scales, biases)
    list; None before any write) with batch rows ``rows``: each run of one
    source row repeated as often as it is asked for, one copy each. Not
    ``mx.take``: on MLX's CPU backend a gather along the batch axis of such
    buffers costs up to 30x a copy."""
    if v is None:
        return None
    if type(v) in (tuple, list):
        return type(v)(_take_rows(x, rows) for x in v)
    runs = [(r, len(list(g))) for r, g in groupby(rows)]
    if [r for r, _ in runs] == list(range(v.shape[0])) and len({n for _, n in runs}) == 1:
        return mx.repeat(v, runs[0][1], axis=0)  # every row in order, as often each
    return mx.concatenate([mx.repeat(v[r:r + 1], n, axis=0) for r, n in runs])


class Appending(Mode):
    """KVCache, QuantizedKVCache: rows in time order in a step-allocated
    buffer; rows past ``offset`` are never read and later writes overwrite
    them, so moving ``offset`` back is an exact save and restore."""

    attention = True
    grows_in_parts = True
    forks = True
    adopts = True

    def offset(self, c):
        return c.offset

    def fork(self, c, rows):
        # The same attributes (offset, step, a quantized cache's bits and
        # group size), the arrays taken along the batch axis: whole buffers,
        # so that the rows' next writes land in place. Rows past offset are
        # never read.
        f = copy.copy(c)
        f.keys, f.values = _take_rows(c.keys, rows), _take_rows(c.values, rows)
        return f

    def adopt(self, c, fork, row):
        # The model's own update, with the rows the fork's update stored
        # (slices: no gather, no copy of the fork's buffers).
        start, end = c.offset, fork.offset
        if end > start:
            c.update_and_fetch(fork.keys[row:row + 1, :, start:end, :],
                               fork.values[row:row + 1, :, start:end, :])

    def written(self, c):
        return c.keys is not None

    def verify_refusal(self, c):
        return _batch_refusal(c)

    def save(self, c):
        return c.offset

    def restore(self, c, saved):
        c.offset = saved

    def hold(self, c):
        # Its whole state, without walking its attributes: the arrays as
        # they are now (``kept``), the offset, and the attribute names (a
        # forward that set a new one loses it; ``step`` never changes).
        return kept(c.keys), kept(c.values), c.offset, tuple(vars(c))

    def put_back(self, c, held) -> None:
        c.keys, c.values, c.offset, names = held
        for name in [k for k in vars(c) if k not in names]:
            delattr(c, name)

    def trim(self, c, offset: int) -> None:
        """Keep the first ``offset`` rows: mlx-lm's trim. Rows past ``offset``
        are never read and the next update overwrites them, so this is the
        whole commit whenever the rows kept already sit in their slots (a
        path that is a prefix of the verify's node order; a drafter's
        accepted prefix of its fed order)."""
        c.offset = offset

    def plan_commit(self, c, where, tail, entry, recurrent, start_position=0):
        """The path's rows compacted to ``tail.offset ..`` in the buffer, in
        place. A path that is a prefix of the node order (every chain round,
        and every tree round that accepts first choices: the drafters lay
        trees out so) moves no row: the plan is a :meth:`trim`, with nothing
        to read or evaluate (which on CUDA would synchronize).
        ``start_position``: the position of stored row 0 (a chunked cache's
        dropped front)."""
        _check_tail(c, where, tail)
        offset = tail.offset + tail.k
        if tail.first_moved == tail.k:
            return CommitPlan(offset=offset)
        rows = gather_path(c, tail.offset - start_position, tail)
        return CommitPlan(rows.reads, offset=offset, rows=rows)

    def apply(self, c, plan):
        if plan.rows is not None:
            c.keys, c.values = plan.rows.place(c)
        self.trim(c, plan.offset)


class Quantized(Appending):
    """QuantizedKVCache: an appending cache whose rows are stored quantized.
    It forks (the packed rows, scales and biases taken alike) but adopts no
    forked row: its update quantizes what it is given, and the fork holds
    rows already quantized."""

    adopts = False

    def adopt(self, c, fork, row):
        return Mode.adopt(self, c, fork, row)


class Chunked(Appending):
    """ChunkedKVCache (llama4): an appending buffer that drops its front once
    it holds more than a chunk. Verify is refused on it (its chunk mask is
    built from flattened row indices); commit keeps the planner for rows that
    one update wrote inside one chunk."""

    grows_in_parts = False
    forks = False

    def fork(self, c, rows):
        # Its forward may drop the front rows: not a drafter's cache.
        return Mode.fork(self, c, rows)

    def verify_refusal(self, c):
        # The one family that makes it (llama4) builds its chunk mask in the
        # model from flattened row indices (mx.arange), never asking the cache:
        # a tree mask cannot be injected there.
        return ("ChunkedKVCache is not a cache whose mask a tree verify can replace: "
                "chunked attention (llama4) builds its chunk mask from flattened row "
                "indices, not through cache.make_mask")

    def save(self, c):
        return Mode.save(self, c)

    def restore(self, c, saved):
        return Mode.restore(self, c, saved)

    def hold(self, c):
        # Its forward may drop the front rows (maybe_trim_front): every attribute.
        return Mode.hold(self, c)

    def snapshot(self, c):
        return c.start_position

    def plan_commit(self, c, where, tail, entry, recurrent):
        # The chunk mask counts flattened row indices, not node depths, so a
        # tree whose rows straddle a chunk boundary was verified against the
        # wrong keys. Within one chunk, depth and row agree on it.
        cs = c.chunk_size
        first, last = tail.offset, tail.offset + tail.n - 1
        if first // cs != last // cs:
            refuse(c, where, f"the tree's rows {first}..{last} cross a chunk boundary "
                   f"(chunk_size {cs}); the chunk mask cannot be exact for it")
        if tail.offset < c.start_position:
            refuse(c, where, "the tree rows start before the chunk kept in the cache")
        if entry is not None:
            # The forward trims the front once, before its update (llama4 calls
            # maybe_trim_front); a path fed alone would see that same trim.
            start0 = entry.state
            expected = start0 if tail.offset - start0 <= cs else tail.offset - cs
            if c.start_position != expected:
                refuse(c, where, f"start_position {c.start_position} is not the {expected} one "
                       "forward leaves: the tree rows were not written by a single update")
        return super().plan_commit(c, where, tail, entry, recurrent, c.start_position)


def _place_and_cut(c, plan) -> None:
    """The path's rows placed (``plan.rows``), then the arrays themselves cut
    to the ``plan.end`` rows kept: for caches whose later updates append
    after the arrays' end, not after ``offset``."""
    keys, values = plan.rows.place(c)
    c.keys, c.values = keys[..., : plan.end, :], values[..., : plan.end, :]


class Concatenate(Mode):
    """ConcatenateKVCache: every update builds new arrays and ``trim`` only
    moves ``offset`` (the next update concatenates after the stale tail), so
    a commit shortens the arrays themselves."""

    attention = True

    def offset(self, c):
        return c.offset

    def written(self, c):
        return c.keys is not None

    def verify_refusal(self, c):
        if c.keys is not None and c.keys.shape[2] != c.offset:
            return (f"ConcatenateKVCache holds {c.keys.shape[2]} keys but offset {c.offset} "
                    "(a trimmed stale tail)")
        return _batch_refusal(c)

    def save(self, c):
        return c.keys, c.values, c.offset

    def restore(self, c, saved):
        c.keys, c.values, c.offset = saved

    def plan_commit(self, c, where, tail, entry, recurrent):
        _check_tail(c, where, tail)
        if c.keys.shape[2] != c.offset:
            refuse(c, where, f"{c.keys.shape[2]} rows stored but offset {c.offset}")
        # An empty cache stored the caller's arrays as they are: not ours to write.
        rows = gather_path(c, tail.offset, tail, owned=tail.offset > 0)
        end = tail.offset + tail.k
        return CommitPlan(rows.reads, offset=end, rows=rows, end=end)

    def apply(self, c, plan):
        _place_and_cut(c, plan)
        c.offset = plan.offset


def rotating_present(c: RotatingKVCache) -> int:
    """Keys ``RotatingKVCache._update_concat`` finds once it has time-ordered
    the buffer (``_temporal_order``: the whole buffer when full or wrapped,
    else ``[:_idx]``)."""
    if c.keys is None:
        return 0
    size = c.keys.shape[2]
    return size if (c._idx == size or c._idx < c.offset) else c._idx


def rotating_kept(c: RotatingKVCache) -> int:
    """How many old keys a multi-token update keeps in front of its own n
    (the history the verify's attention sees): ``_update_concat`` trims the
    time-ordered buffer to ``max_size - 1`` before appending."""
    return min(rotating_present(c), c.max_size - 1)


class Rotating(Mode):
    """RotatingKVCache, before or after its window wrapped."""

    attention = True
    whole_trees_only = True

    def offset(self, c):
        return c.offset

    def written(self, c):
        return c.keys is not None

    def verify_refusal(self, c):
        present = rotating_present(c)
        if present > c.offset:
            return (f"RotatingKVCache holds {present} time-ordered keys but offset is "
                    f"{c.offset}: an inconsistent state")
        # Kept slots (keep > 0) are fine: the verify lays the ring out as a
        # one-token step sees it, kept slots included (treespec.ring).
        return _batch_refusal(c)

    def window(self, c):
        return c.max_size

    def key_positions(self, c):
        # Once wrapped it keeps fewer keys than its offset, and always means
        # a window of at most max_size.
        return c.offset, rotating_kept(c), c.max_size

    def ring(self, c) -> Ring:
        """The ring the next one-token step of ``c`` sees (treespec.ring)."""
        stored = 0 if c.keys is None else c.keys.shape[2]
        return ring_of(c.max_size, c.keep, c.offset, stored, c._idx)

    def verify_plan(self, c, tree):
        """A verify of 2+ nodes lays the ring out as classic one-token steps
        see it (treespec.ring): :class:`RingVerify`."""
        return RingVerify(c, self.ring(c), tree)

    def save(self, c):
        # A one-token step writes into the ring in place: copy the ring.
        keys = None if c.keys is None else (mx.array(c.keys), mx.array(c.values))
        return keys, c.offset, c._idx

    def restore(self, c, saved):
        keys, c.offset, c._idx = saved
        c.keys, c.values = keys if keys is not None else (None, None)

    def snapshot(self, c):
        # A multi-token update (_update_concat) builds new arrays, so the
        # pre-verify ring survives a tree of 2+ nodes untouched.
        return c.keys, c.values, c.offset, c._idx

    def plan_commit(self, c, where, tail, entry, recurrent):
        """A 1-node tree took ``_update_in_place``: the path is that node,
        nothing to do. A tree of n >= 2 verified by treespec laid the ring out
        as classic one-token steps see it (:class:`RingVerify`: the cache then
        holds ``filled + n`` rows in that layout and ``_idx`` the slot the
        next step writes): the commit keeps, slot by slot, what ``k`` classic
        steps along the path would have left (treespec.ring.committed).

        A tree of n >= 2 fed through mlx-lm's own multi-token update
        (``_update_concat``: the kept history in temporal order, trimmed to
        ``max_size - 1`` rows, then the n nodes; ``_idx == keys.shape[2] ==
        m + n`` with ``m = min(offset, max_size - 1)``) commits as one update
        of the path would: ``m + k`` rows, or for a root-only path the
        pre-verify ring (from the snapshot) with the root written in place.

        Tree rows written by several updates (a drafter growing its tree)
        are trimmed or rotated differently; that layout is refused."""
        _check_tail(c, where, tail)
        if tail.n == 1:
            return None
        stored = c.keys.shape[2]
        filled = min(tail.offset, c.max_size)
        end = tail.offset + tail.k
        if c._idx < c.max_size and stored == filled + tail.n and c._idx != stored:
            # The ring layout: every kept slot taken from where the verify
            # laid it out (treespec.ring.committed).
            ring = Ring(c.max_size, c.keep, tail.offset, np.arange(filled, dtype=np.int64), c._idx)
            rows, idx = committed(layout(ring, tail.depths, tail.parents), tail.path)
            order = mx.array(rows.astype(np.int32))
            arrays = (mx.take(c.keys, order, axis=2), mx.take(c.values, order, axis=2))
            return CommitPlan(arrays, offset=end, arrays=arrays, idx=idx)
        m = min(tail.offset, c.max_size - 1)
        if not c._idx == stored == m + tail.n:
            refuse(c, where, f"_idx {c._idx} with {stored} rows is neither the ring layout of a "
                   f"verify ({filled} ring rows, then the {tail.n} nodes) nor the one a "
                   f"{tail.n}-token update leaves ({m} history rows, then the nodes): the tree "
                   "rows were not written by a single update")
        if tail.k >= 2:
            # mlx-lm's multi-token layout: the path compacted behind the m
            # history rows, as one update of the path would have stored it.
            rows = gather_path(c, m, tail, owned=tail.offset > 0)
            return CommitPlan(rows.reads, offset=end, rows=rows, end=m + tail.k, idx=m + tail.k)
        if entry is None:
            refuse(c, where, "a root-only path of a multi-node tree must be rewritten into the "
                   "pre-verify ring; pass snapshot=snapshot(cache) taken before the verify")
        offset0 = entry.state[2]
        if offset0 != tail.offset:
            refuse(c, where, f"snapshot offset {offset0} is not offset {tail.offset}")
        root = (c.keys[..., m : m + 1, :], c.values[..., m : m + 1, :])
        return CommitPlan(root, restore=entry.state, step=root)

    def apply(self, c, plan):
        if plan.restore is not None:
            # A root-only path: the pre-verify ring (keys, values, offset,
            # _idx), then the root written by the ring's own one-token step.
            c.keys, c.values, c.offset, c._idx = plan.restore
            c._update_in_place(*plan.step)
            return
        if plan.arrays is not None:
            c.keys, c.values = plan.arrays
        else:
            _place_and_cut(c, plan)
        c.offset, c._idx = plan.offset, plan.idx


class RingVerify:
    """One verify of a tree on a RotatingKVCache, laid out as classic
    one-token decoding sees the ring (treespec.ring): for the forward's
    duration the cache answers ``make_mask`` with :meth:`mask` and
    ``update_and_fetch`` with :meth:`update_and_fetch`, which stores the
    ring and the nodes in that layout (``filled + n`` rows, ``_idx`` the
    slot the next classic step writes) for the commit."""

    def __init__(self, c, ring: Ring, tree):
        self.cache, self.ring = c, ring
        self.depths, self.parents = tree.depths(), list(tree.parents)
        self._layouts = {}
        self.updates = 0

    def layout(self, window=None):
        if window is not None and window >= self.ring.size:
            window = None  # a one-token step then sees the whole ring
        if window is not None and self.ring.keep:
            # mlx-lm's one-token mask for a window narrower than the ring
            # rolls over every slot, kept ones too: no layout reproduces it
            # for certain. Asked for before the forward writes anything.
            raise TreeRefused(None, f"RotatingKVCache(max_size={self.ring.size}, "
                              f"keep={self.ring.keep}) with a narrower window {window}: the "
                              "one-token mask of such a ring is not reproduced")
        if window not in self._layouts:
            self._layouts[window] = layout(self.ring, self.depths, self.parents, window)
        return self._layouts[window]

    def key(self) -> tuple:
        """What the layout depends on: caches of equal keys share one mask."""
        r = self.ring
        return (r.size, r.keep, r.offset, r.filled, r.idx, tuple(r.rows))

    def mask(self, window=None) -> mx.array:
        return mx.array(self.layout(window).mask)

    def update_and_fetch(self, keys, values):
        c, ring, n = self.cache, self.ring, keys.shape[2]
        if n != len(self.depths):
            raise RuntimeError(f"the ring layout is for {len(self.depths)} nodes, the forward "
                               f"feeds {n}")
        self.updates += 1
        order = mx.array(self.layout().order.astype(np.int32))
        if ring.filled:
            rows = ring.rows
            take = (lambda a: a[..., : ring.filled, :]) if np.array_equal(rows, np.arange(len(rows))) \
                else (lambda a: mx.take(a, mx.array(rows.astype(np.int32)), axis=2))
            keys = mx.concatenate([take(c.keys), keys], axis=2)
            values = mx.concatenate([take(c.values), values], axis=2)
        c.keys, c.values = mx.take(keys, order, axis=2), mx.take(values, order, axis=2)
        c.offset += n
        c._idx = ring.idx
        return c.keys, c.values
