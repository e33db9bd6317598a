"""The attention cache modes: KVCache and QuantizedKVCache (appending),
ChunkedKVCache, ConcatenateKVCache and RotatingKVCache."""

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache

from ..rows import move_keys_values
from .base import Mode, _batch_refusal, _check_tail, _nothing, refuse


class Appending(Mode):
    """KVCache, QuantizedKVCache: rows in time order in a step-allocated
    buffer; rows past ``offset`` are never read and later writes overwrite
    them, so moving ``offset`` back is an exact save and restore."""

    attention = True
    grows_in_parts = True

    def offset(self, c):
        return c.offset

    def written(self, c):
        return c.keys is not None

    def verify_refusal(self, c):
        return _batch_refusal(c)

    def save(self, c):
        return c.offset

    def restore(self, c, saved):
        c.offset = saved

    def plan_commit(self, c, where, tail, entry, recurrent, start_position=0):
        _check_tail(c, where, tail)
        start = tail.offset - start_position

        def prepare():
            reads, place = move_keys_values(c, start, tail)

            def write():
                c.keys, c.values = place()
                c.offset = tail.offset + tail.k
                return [c.keys, c.values]

            return reads, write

        return prepare


class Chunked(Appending):
    """ChunkedKVCache (llama4): an appending buffer that drops its front once
    it holds more than a chunk. Verify is refused on it (its chunk mask is
    built from flattened row indices); commit keeps the planner for rows that
    one update wrote inside one chunk."""

    grows_in_parts = False

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

        def prepare():
            # An empty cache stored the caller's arrays as they are: not ours to write.
            reads, place = move_keys_values(c, tail.offset, tail, owned=tail.offset > 0)

            def write():
                end = tail.offset + tail.k
                keys, values = place()
                c.keys, c.values = keys[..., :end, :], values[..., :end, :]
                c.offset = end
                return [c.keys, c.values]

            return reads, write

        return prepare


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
        if c.keep and (present != c.offset or present > c.max_size - 1):
            # The kept keys are positions 0..keep-1 plus a recent run. Any
            # multi-token forward's mask (mlx-lm's create_causal_mask, and
            # ours) counts them as contiguous history, so later queries lose
            # the kept tokens while a one-token step attends to them: no
            # verify of this state can match classic decoding (README,
            # "Verify").
            return (f"RotatingKVCache(max_size={c.max_size}, keep={c.keep}) at offset "
                    f"{c.offset} has dropped keys between its {c.keep} kept ones and the "
                    "recent ones: a multi-token forward would not attend as one-token "
                    "decoding does (only keep=0 verifies once wrapped)")
        return _batch_refusal(c)

    def key_positions(self, c):
        # Once wrapped it keeps fewer keys than its offset, and always means
        # a window of at most max_size.
        return c.offset, rotating_kept(c), c.max_size

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
        nothing to do. A tree of n >= 2 took ``_update_concat``, which puts
        the kept history in temporal order, trims it to ``max_size - 1`` rows
        and appends the n nodes: ``_idx == keys.shape[2] == m + n`` with
        ``m = min(offset, max_size - 1)``. A k >= 2 path fed alone would
        leave the same m rows, then the path: keep ``m + k`` rows. A 1-node
        path fed alone takes ``_update_in_place`` on the pre-verify ring,
        which ``_update_concat`` left untouched: redo that write on it.

        Tree rows written by several updates (a drafter growing its tree)
        are trimmed or rotated differently; that layout is refused."""
        _check_tail(c, where, tail)
        if tail.n == 1:
            return _nothing
        m = min(tail.offset, c.max_size - 1)
        if not c._idx == c.keys.shape[2] == m + tail.n:
            refuse(c, where, f"_idx {c._idx} with {c.keys.shape[2]} rows is not the layout one "
                   f"{tail.n}-token update leaves ({m} history rows, then the nodes): the tree "
                   "rows were not written by a single update")
        if tail.k >= 2:

            def prepare():
                reads, place = move_keys_values(c, m, tail, owned=tail.offset > 0)

                def write():
                    end = m + tail.k
                    keys, values = place()
                    c.keys, c.values = keys[..., :end, :], values[..., :end, :]
                    c._idx, c.offset = end, tail.offset + tail.k
                    return [c.keys, c.values]

                return reads, write

            return prepare
        if entry is None:
            refuse(c, where, "a root-only path of a multi-node tree must be rewritten into the "
                   "pre-verify ring; pass snapshot=snapshot(cache) taken before the verify")
        keys0, values0, offset0, idx0 = entry.state
        if offset0 != tail.offset:
            refuse(c, where, f"snapshot offset {offset0} is not offset {tail.offset}")

        def prepare():
            root = [c.keys[..., m : m + 1, :], c.values[..., m : m + 1, :]]

            def write():
                c.keys, c.values, c.offset, c._idx = keys0, values0, offset0, idx0
                c._update_in_place(*root)
                return [c.keys, c.values]

            return root, write

        return prepare
