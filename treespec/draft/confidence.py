"""The confidence-driven tree drafter (EAGLE-2 style): grow by cumulative
draft log-probability and keep the ``budget`` best nodes."""

import heapq
import random
from typing import Optional

from ..checks import integer
from ..gate import shapes_for
from ..tree import DraftTree
from .base import DraftRound
from .fixed import _TopKTree


class ConfidenceDrafter(_TopKTree):
    """EAGLE-2 style: grow by cumulative draft log-probability.

    Each step expands the ``width`` frontier nodes with the highest
    cumulative log-probability in one draft forward, offering each one's
    top-``width`` children; after ``depth`` steps the ``budget`` best
    candidates form the tree. Cumulative log-probability falls along a
    path, so the best ``budget`` nodes (ties broken by creation order)
    always include their ancestors: the result is a tree."""

    kind = "confidence"

    def __init__(self, budget: int, width: int = 4, depth: Optional[int] = None):
        super().__init__()
        budget, width = integer(budget, "budget"), integer(width, "width")
        if budget < 0 or width < 1:
            raise ValueError(f"need budget >= 0 and width >= 1, got {budget}, {width}")
        self._budget, self.width = budget, width
        self.depth = integer(depth, "depth", 1) if depth is not None else max(1, budget)

    def budget(self) -> int:
        return self._budget

    def _top_needed(self) -> int:
        return self.width

    def _grow(self, root, limit) -> DraftRound:
        budget = self._budget if limit is None else min(self._budget, limit)
        # candidates: (cum_logprob, order, parent_candidate, token); 0 is root.
        cands = [(0.0, 0, -1, root)]
        fed_of = {0: 0}
        frontier = [0]
        for _ in range(self.depth):
            if budget == 0:
                break
            for c in frontier:
                for tok, lp in self._children(fed_of[c], self.width):
                    cands.append((cands[c][0] + lp, len(cands), c, tok))
            # Expand the best unexpanded candidates that could still make it.
            best = sorted(self._best(cands, budget), key=lambda i: (-cands[i][0], i))
            frontier = [c for c in best if c not in fed_of][: self.width]
            if not frontier:
                break
            first = len(self._fed_tree)
            for c in sorted(frontier):
                fed_of[c] = self._fed_tree.push_child(fed_of[cands[c][2]], cands[c][3])
            frontier = sorted(frontier)
            self._expand(list(range(first, len(self._fed_tree))))
        keep = sorted(self._best(cands, budget))
        index = {0: 0}
        tree = DraftTree([root], [-1])
        fed = [0]
        logprobs = {0: 0.0}
        for c in keep:
            index[c] = tree.push_child(index[cands[c][2]], cands[c][3])
            fed.append(fed_of.get(c, -1))
            logprobs[index[c]] = cands[c][0]
        return DraftRound(tree, fed, self._round_offset, self._fed_tree, logprobs,
                          forwards=self._forwards)

    @staticmethod
    def _best(cands, budget):
        """Indices of the ``budget`` best non-root candidates.

        Ranked by (-cumulative logprob, creation order): a child's cumulative
        logprob never exceeds its parent's and it is created later, so its
        parent always ranks ahead of it and the set is ancestor-closed."""
        return set(heapq.nsmallest(budget, range(1, len(cands)),
                                   key=lambda i: (-cands[i][0], i)))

    def describe(self):
        return {"kind": self.kind, "budget": self._budget, "width": self.width,
                "depth": self.depth}

    def probe_shapes(self):
        # Its shapes change every round; the backend's kernel choice follows
        # M (the node count), so probe every M with a chain and a seeded
        # branching tree of this drafter's width.
        shapes = shapes_for(self._budget + 1)
        rng = random.Random(self._budget * 1000 + self.width)
        for m in range(3, self._budget + 2):
            parents = [-1]
            for i in range(1, m):
                options = [p for p in range(i) if parents.count(p) < self.width]
                parents.append(rng.choice(options))
            shapes.append(tuple(parents))
        return shapes
