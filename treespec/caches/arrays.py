"""The recurrent cache mode: ArraysCache, a recurrent layer's conv windows
and state."""

from typing import NamedTuple, Optional

import mlx.core as mx

from ..rows import Tail
from .base import CommitPlan, Mode, refuse


class Replay(NamedTuple):
    """How a commit brings a restored recurrent state to the path's last
    node (``CommitPlan.replay``): copy the state a tree-aware recurrence
    kept for that node, or run the captured mixer calls again on the
    path's rows alone."""

    kept: Optional[object]  # rollback.KeptStates of this cache, or None: replay the calls
    node: Optional[int]  # the path's last node, whose kept state is copied
    calls: tuple  # (module, args, kwargs) of each captured call, in the verify's order
    tail: Optional[Tail]  # the verified tail whose path the calls are replayed along


class Arrays(Mode):
    """ArraysCache: a recurrent layer's conv windows and state. The layers
    assign new arrays into the slots and never write into the old ones, so
    keeping the references is a true snapshot."""

    recurrent = True

    def verify_refusal(self, c):
        if c.left_padding is not None or c.lengths is not None:
            return "ArraysCache is prepared for a padded batch"
        return None

    def save(self, c):
        return list(c.cache)

    def restore(self, c, saved):
        c.cache = list(saved)

    def snapshot(self, c):
        return list(c.cache), c.left_padding, c.lengths

    def plan_commit(self, c, where, tail, entry, recurrent):
        """Restore the pre-verify state, then either take the kept state of
        the path's last node (a tree-aware recurrence kept one per node) or
        replay the path's captured inputs through the layer's own mixer, so
        the state is the one a model that only saw the path would hold."""
        if entry is None or recurrent is None:
            refuse(c, where, "a recurrent state cannot be rolled back without its pre-verify "
                   "snapshot and the captured mixer inputs (pass snapshot= and recurrent=)")
        arrays0, left_padding0, lengths0 = entry.state
        if left_padding0 is not None or lengths0 is not None:
            refuse(c, where, "batched recurrent caches (left_padding/lengths) are not supported")
        calls = recurrent.calls_for(c)
        if not calls:
            refuse(c, where, "captured 0 calls of its mixer, expected the verify's")
        kept = recurrent.kept_for(c) if tail.n > 1 else None
        if kept is not None:
            node = int(tail.path[-1])
            kept.node(node)  # raises on a node the tree does not have
            return CommitPlan(restore=entry.state, replay=Replay(kept, node, (), None))
        # Replayed in the verify's order: modules sharing one cache (rwkv7's
        # time and channel mixing) each write their own slots.
        replays = []
        for layer, name, args, kwargs in calls:
            module = layer[name] if isinstance(layer, (list, dict)) else getattr(layer, name)
            if recurrent.is_recorder(module):
                refuse(c, where, "commit inside capture_recurrent_inputs: the mixer is still "
                       "swapped")
            inputs = args[0] if args else next(iter(kwargs.values()), None)
            if not isinstance(inputs, mx.array) or inputs.ndim < 2 or inputs.shape[1] != tail.n:
                refuse(c, where, f"the captured mixer input does not hold the {tail.n} tree "
                       "nodes")
            replays.append((module, args, kwargs))
        return CommitPlan(restore=entry.state, replay=Replay(None, None, tuple(replays), tail))

    def apply(self, c, plan):
        arrays0, left_padding0, lengths0 = plan.restore
        c.cache, c.left_padding, c.lengths = list(arrays0), left_padding0, lengths0
        replay = plan.replay
        if replay.kept is not None:
            replay.kept.write(c, replay.node)
            return
        tail = replay.tail
        idx = mx.array(tail.path, dtype=mx.int32)

        def along_path(a):  # activations and masks carry the nodes on axis 1
            if isinstance(a, mx.array) and a.ndim >= 2 and a.shape[1] == tail.n:
                return mx.take(a, idx, axis=1)
            return a

        for module, args, kwargs in replay.calls:
            module(*map(along_path, args), **{k: along_path(v) for k, v in kwargs.items()})
