"""The chain drafter: mlx-lm's speculative draft loop, as a linear tree."""

from typing import Optional

import mlx.core as mx

from ..checks import integer
from ..gate import shapes_for
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

    def budget(self) -> int:
        return self.block - 1

    def draft(self, root: int, limit: Optional[int] = None) -> Round:
        """mlx-lm's draft loop: each greedy token feeds the next step without
        leaving the graph (async evaluation), one sync per round. The last
        draft is never fed, as in mlx-lm."""
        n = self.block - 1 if limit is None else min(self.block - 1, limit)
        if self.compacting and n:
            # The accepted tokens the draft never fed go in with the root, as
            # mlx-lm does: one forward, not an extra forward and sync in every
            # round that accepted the whole chain.
            first, self.pending = self.pending + [root], []
        else:  # a saved round start must come after them, before the root
            self._feed(self.pending)
            first, self.pending = [root], []
            self._saved = self._save()
        offset = self._offset() + len(first) - 1
        y, drafts = mx.array(first), []
        for _ in range(n):
            logits = self.model(y[None], cache=self.cache)[0, -1]
            y = mx.argmax(logits, axis=-1, keepdims=True)
            mx.async_eval(y)
            drafts.append(y)
        # The draft model was fed root .. d_{n-1}; the last draft never is.
        return DeviceRound(root, list(range(-1, n)), mx.concatenate(drafts) if drafts else None,
                           [i if i < n else -1 for i in range(n + 1)], offset, forwards=n)

    def describe(self):
        return {"kind": self.kind, "block": self.block, "budget": self.block - 1}

    def probe_shapes(self):
        return shapes_for(self.block)
