"""A sliding-window ring as classic one-token decoding sees it, and the key
layout that lets one forward over a tree see it the same way. Index math
only (numpy); ``treespec.caches`` applies it to a RotatingKVCache.

Why: mlx-lm's RotatingKVCache writes a one-token step in place, into the
slot after the last one written, and hands the attention its keys in slot
order; a multi-token update first puts them in time order. Once the ring
has wrapped the two orders differ, so the attention's sums over keys (the
softmax normaliser and ``p @ v``) add the same terms in a different order
and round differently: a multi-token verify does not reproduce classic
decoding bit for bit (in float32 always, in half precision now and then).

So a verify over a tree on a ring uses this layout instead: for every slot
in order, the ring's key there, then every tree node the classic step of its
depth would write into that slot. Each node's mask shows a slot's old key
unless its own root path overwrote that slot, and each ancestor's key only
where it is the latest write to its slot on the path (a path longer than the
ring writes a slot twice). The keys a node sees are then exactly the ones its
classic step sees, in the same relative order; masked keys in between add
exact zeros to both sums. The commit then writes the accepted path into the
slots classic decoding would have written.

``Ring`` is what the next one-token step does with a cache's fields: which
stored rows it keeps (``rows``, in slot order), the slot it writes
(``idx``), how many slots hold keys (``filled``) and which position each
holds. It mirrors ``RotatingKVCache._update_in_place`` (grow, trim, rotate
to ``keep``) exactly; suites/ring/test_ring.py checks it against that
method step by step.
"""

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np


@dataclass(frozen=True)
class Ring:
    size: int  # max_size
    keep: int  # leading slots never overwritten
    offset: int  # positions seen
    rows: np.ndarray  # stored rows the next step keeps, in slot order (int64)
    idx: int  # the slot the next one-token step writes

    @property
    def filled(self) -> int:
        return len(self.rows)

    def slots(self, steps: int) -> np.ndarray:
        """The slot each of the next ``steps`` one-token writes goes to:
        ``idx``, ``idx + 1``, ... up to ``size - 1``, then ``keep``,
        ``keep + 1``, ... (the ring rotates to ``keep``)."""
        cycle = self.size - self.keep
        j = np.arange(steps, dtype=np.int64)
        first = self.idx + j
        over = first - self.size
        return np.where(over < 0, first, self.keep + np.mod(over, cycle))

    def positions(self) -> np.ndarray:
        """The position held by each filled slot (slot order)."""
        if self.offset <= self.size:  # nothing dropped yet: slot s holds position s
            return np.arange(self.filled, dtype=np.int64)
        # Full: keep slots hold 0..keep-1; the cycle's slot idx holds the
        # oldest surviving position, the one before it the newest.
        cycle = self.size - self.keep
        s = np.arange(self.size, dtype=np.int64)
        age = np.mod(s - self.idx, cycle)  # 0 for the oldest
        return np.where(s < self.keep, s, self.offset - cycle + age)


def ring_of(size: int, keep: int, offset: int, stored: int, idx: int) -> Ring:
    """The ring the next one-token step of a RotatingKVCache sees, from its
    fields (``max_size``, ``keep``, ``offset``, ``keys.shape[2]``, ``_idx``),
    following ``_update_in_place``: a buffer it would grow keeps its rows
    and writes at ``offset``; one longer than ``size`` (left by a multi-token
    update) is trimmed to its ``keep`` first and last ``size - keep`` rows;
    a write index at ``size`` rotates to ``keep``."""
    if stored == 0:
        return Ring(size, keep, offset, np.zeros(0, np.int64), 0)
    rows = np.arange(stored, dtype=np.int64)
    if offset >= stored and stored < size:  # it grows: the next write goes at offset
        return Ring(size, keep, offset, rows[:offset], offset)
    visible = rows[:offset] if offset < stored else rows  # keys_and_values
    if stored > size:
        trim = stored - size
        visible = np.concatenate([rows[:keep], rows[trim + keep:]])
        idx = size
    if idx >= size:
        idx = keep
    return Ring(size, keep, offset, visible, idx)


@dataclass(frozen=True)
class Layout:
    """Where a verify over a tree puts the keys of a ring and the nodes.

    Columns index ``[ring slots | nodes]``: column ``c < filled`` is the
    ring's slot ``c``, column ``filled + i`` is node i. ``order`` is the
    column sequence of the keys the attention sees; ``mask[i, j]`` says
    whether node i sees the key at ``order[j]``."""

    ring: Ring
    order: np.ndarray  # int64 [filled + n]
    mask: np.ndarray  # bool [n, filled + n]
    slot: np.ndarray  # int64 [n], the slot each node's classic step writes


def layout(ring: Ring, depths: Sequence[int], parents: Sequence[int],
           window: Optional[int] = None) -> Layout:
    """The key layout and masks of a verify of the tree (``depths``,
    ``parents``: node 0 the root, parents before children) on ``ring``.
    ``window``: the attention window in positions (None: the whole ring), as
    ``RotatingKVCache.make_mask`` gives a one-token step."""
    depths = np.asarray(depths, dtype=np.int64)
    n, filled = len(depths), ring.filled
    slot = ring.slots(int(depths.max()) + 1)[depths]
    # Columns in slot order; within a slot, the ring's key, then the nodes
    # writing it in node order.
    col_slot = np.concatenate([np.arange(filled), slot])
    col_rank = np.concatenate([np.zeros(filled, np.int64), 1 + np.arange(n)])
    order = np.lexsort((col_rank, col_slot)).astype(np.int64)
    anc = np.zeros((n, n), dtype=bool)  # anc[i, a]: a on node i's root path
    for i in range(n):
        if parents[i] >= 0:
            anc[i] = anc[parents[i]]
        anc[i, i] = True
    n_slots = max(filled, int(slot.max()) + 1)
    writes = np.zeros((n, n_slots), dtype=bool)  # node i's path writes slot s
    deepest = np.full((n, n_slots), -1, dtype=np.int64)  # its deepest writer's depth
    for a in range(n):
        on = anc[:, a]
        writes[on, slot[a]] = True
        deepest[on, slot[a]] = np.maximum(deepest[on, slot[a]], depths[a])
    see = np.zeros((n, filled + n), dtype=bool)
    see[:, :filled] = ~writes[:, :filled]
    see[:, filled:] = anc & (depths[None, :] == deepest[:, slot])
    if window is not None:
        q = ring.offset + depths
        see[:, :filled] &= (q[:, None] - ring.positions()[None, :filled]) < window
        see[:, filled:] &= (depths[:, None] - depths[None, :]) < window
    return Layout(ring, order, see[:, order], slot)


def committed(lay: Layout, path: Sequence[int]) -> Tuple[np.ndarray, int]:
    """After the accepted root ``path`` is committed, which layout rows (into
    ``order``) form the ring, in slot order, and the next write slot: what
    ``len(path)`` classic one-token steps would have left."""
    filled = lay.ring.filled
    where = np.empty(len(lay.order), dtype=np.int64)  # column -> layout row
    where[lay.order] = np.arange(len(lay.order))
    path = np.asarray(path, dtype=np.int64)
    slots = lay.slot[path]
    n_slots = max(filled, int(slots.max()) + 1)
    slot_col = np.full(n_slots, -1, dtype=np.int64)
    slot_col[:filled] = np.arange(filled)
    # A slot the path writes twice keeps its later (deeper) write.
    uniq, last_of = np.unique(slots[::-1], return_index=True)
    slot_col[uniq] = filled + path[::-1][last_of]
    if (slot_col < 0).any():
        raise ValueError(f"committing {path.tolist()} leaves a hole in the ring")
    return where[slot_col], int(slots[-1]) + 1
