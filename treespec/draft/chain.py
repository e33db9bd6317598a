"""The chain drafter: mlx-lm's speculative draft loop, as a linear tree."""

from typing import Optional

import mlx.core as mx

from ..checks import integer
from ..evidence.gate import shapes_for
from ..tree import DraftTree
from .base import DeviceRound, Drafter, Round


class ChainDrafter(Drafter):
    """A chain of ``block - 1`` greedy drafts: verify width ``block``."""

    kind = "chain"

    def __init__(self, block: int):
        super().__init__()
        block = integer(block, "block")
        if block < 1:
            raise ValueError(f"chain block must be >= 1 (the root alone), got {block}")
        self.block = block
        self._shapes = {}  # n -> (topology, fed) of a round of n drafts

    def budget(self) -> int:
        return self.block - 1

    def draft(self, root: int, limit: Optional[int] = None) -> Round:
        """mlx-lm's draft loop: each greedy token feeds the next step without
        leaving the graph (async evaluation), one sync per round. The last
        draft is never fed, as in mlx-lm."""
        n = self.block - 1 if limit is None else min(self.block - 1, limit)
        # The accepted tokens the draft never fed go in with the root, as
        # mlx-lm does: one forward, not an extra forward and sync in every
        # round that accepted the whole chain (a cache that is put back to
        # the round's start is fed them first).
        lead = self._start_round() if n else self._start_root_only()
        offset = self._round_offset
        y, drafts = mx.array(lead + [root]), []
        for _ in range(n):
            logits = self.model(y[None], cache=self.cache)[0, -1]
            y = mx.argmax(logits, axis=-1, keepdims=True)
            mx.async_eval(y)
            drafts.append(y)
        topology, fed = self._shapes.get(n) or self._shapes.setdefault(n, (
            DraftTree.linear([0] * (n + 1)), [i if i < n else -1 for i in range(n + 1)]))
        # The draft model was fed root .. d_{n-1}; the last draft never is.
        return DeviceRound(root, topology, mx.concatenate(drafts) if drafts else None,
                           fed, offset, forwards=n)

    def _start_root_only(self) -> list:
        """A round with no drafts (max_tokens reached) runs no forward: the
        pending tokens are fed (they are committed text), the root is not."""
        self._feed(self.pending)
        self.pending = []
        self._round_offset = self._offset()
        self._saved = self._save()
        return []

    def describe(self):
        return {"kind": self.kind, "block": self.block, "budget": self.block - 1}

    def probe_shapes(self, limit: Optional[int] = None):
        return shapes_for(self.block if limit is None else min(self.block, limit + 1))
