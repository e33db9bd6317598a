"""Fixed-topology tree drafters (SpecInfer / Medusa style): the draft's
top-k children at each depth, k from a list of branching factors, or an
explicit parent list filled with the top-ranked children in node order."""

from collections import Counter
from typing import List, Optional, Sequence

import mlx.core as mx

from ..checks import integer
from ..gate import shapes_for
from ..tree import DraftTree
from .base import DeviceRound, DraftRound, Drafter, Round, logprobs_of, top_ids


class _TopKTree(Drafter):
    """Trees whose candidates are the draft's top-k children per node."""

    def _children(self, node, k):
        """The draft's top ``k`` (token, logprob) at fed node ``node``, best
        first (fetched with the node's logprobs by ``_expand``)."""
        top = self._top[node]
        if k > len(top):
            raise ValueError(f"asked for {k} children, the drafter fetches {len(top)}")
        return top[:k]


class FixedTreeDrafter(_TopKTree):
    """A fixed topology: ``branching[d]`` children for every node at depth d
    (top-k of the draft), or an explicit parent list whose shape is filled
    with the top-ranked children in node order."""

    kind = "fixed"

    def __init__(self, branching: Optional[Sequence[int]] = None,
                 parents: Optional[Sequence[int]] = None):
        super().__init__()
        if (branching is None) == (parents is None):
            raise ValueError("give exactly one of branching factors or parent lists")
        if branching is not None:
            branching = [integer(b, f"branching[{d}]") for d, b in enumerate(branching)]
            if not branching or any(b < 1 for b in branching):
                raise ValueError(f"branching factors must be >= 1, got {list(branching)}")
            parents = [-1]
            level = [0]
            for b in branching:
                nxt = []
                for p in level:
                    for _ in range(b):
                        parents.append(p)
                        nxt.append(len(parents) - 1)
                level = nxt
        # Validate the shape once, with placeholder tokens; keep it in level
        # order, the order a round's tree is built in, so that the shapes the
        # gate probes (prefixes of it) are the trees verified.
        depths = DraftTree([0] * len(parents), parents).depths()
        order = sorted(range(len(parents)), key=lambda i: (depths[i], i))
        where = {node: k for k, node in enumerate(order)}
        self.shape = [-1] + [where[parents[i]] for i in order[1:]]
        self.branching = list(branching) if branching is not None else None
        # The most children any node has: how many top tokens each expansion fetches.
        self._kmax = max(Counter(self.shape[1:]).values(), default=1)

    def budget(self) -> int:
        return len(self.shape) - 1

    def _top_needed(self) -> int:
        return self._kmax

    # Children are the draft's top-k, a function of the logits alone: the
    # whole tree can be drafted on the device (SampledTreeDrafter draws its
    # children on the host and turns this off).
    on_device = True

    def draft(self, root: int, limit: Optional[int] = None) -> Round:
        n = len(self.shape) if limit is None else min(len(self.shape), limit + 1)
        if self.on_device and self.compacting and n > 1:
            return self._draft_on_device(root, self.shape[:n])
        return super().draft(root, limit)

    def _draft_on_device(self, root: int, shape: List[int]) -> DeviceRound:
        """The same tree as ``_grow``, with no host round trip per level: each
        level's tokens are gathered from its parents' device top-k, and the
        level's internal nodes are fed (continuing the cache: tree-injected,
        or a plain forward while they form a chain, as a spine's do) on those
        lazy tokens. Caches that must be restored to grow a tree in
        parts (sliding window, recurrent) take the host path."""
        first, self.pending = self.pending + [root], []
        offset = self._offset() + len(first) - 1
        depths = DraftTree([0] * len(shape), shape).depths()
        internal = set(shape[1:])
        logits = self.model(mx.array(first)[None], cache=self.cache)[0, -1:]
        top = {0: self._device_top(logits)[0]}
        mx.async_eval(top[0])
        fed, fed_parents, token, forwards = [0] + [-1] * (len(shape) - 1), [-1], {}, 1
        for d in range(1, int(depths.max()) + 1):
            level = [i for i in range(1, len(shape)) if depths[i] == d]
            rank = {}
            for i in level:  # the r-th child of a node is its r-th best token
                r = rank.get(shape[i], 0)
                rank[shape[i]] = r + 1
                token[i] = top[shape[i]][r : r + 1]
            expand = [i for i in level if i in internal]
            if expand:
                forwards += 1
                start = len(fed_parents)
                for i in expand:
                    fed[i] = len(fed_parents)
                    fed_parents.append(fed[shape[i]])
                logits = self.adapter.verify(
                    DraftTree([0] * len(fed_parents), fed_parents), self.cache, start=start,
                    tokens=mx.concatenate([token[i] for i in expand]))
                level_top = self._device_top(logits)
                # Started now, as the chain starts each draft: the device runs
                # this level while the host builds the next one.
                mx.async_eval(level_top)
                for node, order in zip(expand, level_top):
                    top[node] = order
        drafts = mx.concatenate([token[i] for i in range(1, len(shape))])
        # The shape is in level order.
        return DeviceRound(root, shape, drafts, fed, offset, forwards=forwards)

    def _device_top(self, logits: mx.array) -> mx.array:
        """Per row, the ``_kmax`` best token ids, best first: ``_expand``'s
        ranking (``top_ids`` of float32 log-probabilities), left on the device."""
        return top_ids(logprobs_of(logits), self._kmax)

    def _grow(self, root, limit) -> DraftRound:
        shape = self.shape
        n = len(shape) if limit is None else min(len(shape), limit + 1)
        depths = DraftTree([0] * len(shape), shape).depths()[:n]
        tree = DraftTree([root], [-1])
        index = {0: 0}  # shape node -> tree node (the tree is in level order)
        fed = [0]  # tree node -> fed-tree node, -1 if never fed
        for d in range(1, int(depths.max()) + 1):
            level = [i for i in range(1, n) if depths[i] == d]
            # One draft forward expands every parent of this level.
            new = sorted({index[shape[i]] for i in level if fed[index[shape[i]]] < 0})
            if new:
                first = len(self._fed_tree)
                for t in new:
                    fed[t] = self._fed_tree.push_child(fed[tree.parents[t]], tree.tokens[t])
                self._expand(list(range(first, len(self._fed_tree))))
            rank = {}
            for i in level:
                p = index[shape[i]]
                rank[p] = rank.get(p, 0) + 1
                tok, _ = self._children(fed[p], rank[p])[rank[p] - 1]
                index[i] = tree.push_child(p, tok)
                fed.append(-1)
        return DraftRound(tree, fed, self._round_offset, self._fed_tree, forwards=self._forwards)

    def describe(self):
        return {"kind": self.kind, "branching": self.branching, "budget": self.budget()}

    def probe_shapes(self):
        # The shape, and its prefixes (what a round cut short by max_tokens
        # verifies), after every chain up to its depth.
        depth = int(DraftTree([0] * len(self.shape), self.shape).depth())
        return shapes_for(depth + 1) + [tuple(self.shape[:m]) for m in range(2, len(self.shape) + 1)]


def fixed_shape(spec: Sequence[int]) -> dict:
    """``FixedTreeDrafter`` keywords for one fixed-shape spec: branching
    factors (all >= 1), or a parent list, told apart by its root's -1."""
    spec = [int(x) for x in spec]
    return {"parents": spec} if spec and spec[0] == -1 else {"branching": spec}


def shape_name(spec: Sequence[int]) -> str:
    """'[2,1,1]' for branching factors, 'p[-1,0,0,1,1]' for a parent list."""
    kind = "p" if "parents" in fixed_shape(spec) else ""
    return f"{kind}[" + ",".join(str(int(x)) for x in spec) + "]"
