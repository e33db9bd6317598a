"""Drafters: each round they grow a DraftTree from a draft model.

A drafter owns the draft model's cache. Between rounds that cache holds the
committed text except the root (the last committed token), exactly like the
target's. Drafting feeds the root and the nodes it expands into the cache;
``commit`` keeps only the accepted ones (the same ``commit_path`` the target
uses), and remembers accepted tokens the draft never fed so the next round
feeds them first.

Three shapes, one mechanism:
- ``ChainDrafter(block)``: a chain of ``block - 1`` greedy drafts (mlx-lm's).
- ``FixedTreeDrafter(branching)``: SpecInfer/Medusa style; the top-k
  children at each depth, k from a list of branching factors, or explicit
  parent lists.
- ``ConfidenceDrafter(budget, ...)``: EAGLE-2 style; expands the nodes with
  the highest cumulative draft log-probability and keeps the ``budget`` best.
"""

import heapq
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from .gate import shapes_for
from .rollback import commit_path
from .tree import DraftTree
from .verify import adapter_for

# Caches whose rows sit in time order in a buffer that later writes simply
# overwrite: a drafted tree can be grown in parts (verify's ``start``) and
# compacted to the accepted path in place.
COMPACTING = (KVCache, QuantizedKVCache)


@dataclass
class DraftRound:
    tree: DraftTree
    # fed[i] = index in ``fed_tree`` of tree node i, or -1 when the draft
    # model never saw that node (a leaf it did not expand).
    fed: List[int]
    offset: int  # draft cache length before the round
    fed_tree: DraftTree  # what the draft cache holds past `offset`, in order
    logprobs: dict = field(default_factory=dict)  # tree node -> cumulative logprob

    # What the round loop verifies: the topology, and the tokens as a device
    # array when they are still being computed (None: the tree's own tokens).
    @property
    def topology(self) -> DraftTree:
        return self.tree

    device_tokens = None


class DeviceRound(DraftRound):
    """A round whose draft tokens may still be computing on the device.

    The drafter knew the topology (``parents``) and which nodes it fed
    (``fed``) before any token value: a chain, or a fixed shape whose children
    are the draft's top-k. ``device_tokens`` (all nodes, lazy) is what the
    round loop builds the target's verify on, so drafting and verifying are
    evaluated as one graph (mlx-lm's structure for chains): the host neither
    waits for the drafts nor leaves the device idle while it builds the verify
    graph (2.4% of the wall time of a block-4 chain on the trained pair).
    ``tree`` reads the tokens (waiting for them) on first use."""

    def __init__(self, root: int, parents: Sequence[int], drafts: Optional[mx.array],
                 fed: List[int], offset: int):
        self.root, self.parents, self.offset, self.logprobs = root, list(parents), offset, {}
        self.fed = list(fed)
        self._drafts, self._tree = drafts, None
        self.device_tokens = (
            None if drafts is None
            else mx.concatenate([mx.array([root], dtype=drafts.dtype), drafts])
        )

    @property
    def topology(self) -> DraftTree:
        return DraftTree([self.root] * len(self.parents), self.parents)

    @property
    def tree(self) -> DraftTree:
        if self._tree is None:
            drafts = [] if self._drafts is None else self._drafts.tolist()
            self._tree = DraftTree([self.root] + drafts, self.parents)
        return self._tree

    @property
    def fed_tree(self) -> DraftTree:
        """What the draft cache holds past ``offset``: the fed nodes, in the
        order they were fed (the root alone when nothing was)."""
        order = sorted((f, i) for i, f in enumerate(self.fed) if f >= 0)
        if not order:
            return DraftTree([self.root], [-1])
        tokens = self.tree.tokens
        return DraftTree([tokens[i] for _, i in order],
                         [-1 if i == 0 else self.fed[self.parents[i]] for _, i in order])


def cache_offset(cache) -> int:
    """Logical length of a model's cache: what the next token's position is."""
    for c in cache:
        off = getattr(c, "offset", None)
        if isinstance(off, int):
            return off
    raise ValueError("no cache entry reports an integer offset")


def _save(c):
    """What it takes to put one cache back exactly as it is now, whatever
    the draft writes next. Cost bounded by the window, never the context."""
    if isinstance(c, CacheList):
        return [_save(x) for x in c.caches]
    if isinstance(c, COMPACTING):
        return c.offset  # rows past offset are never read, later writes overwrite them
    if isinstance(c, RotatingKVCache):
        # A one-token step writes into the ring in place: copy the ring.
        keys = None if c.keys is None else (mx.array(c.keys), mx.array(c.values))
        return keys, c.offset, c._idx
    if isinstance(c, ConcatenateKVCache):
        return c.keys, c.values, c.offset  # updates build new arrays
    if isinstance(c, ArraysCache):
        return list(c.cache)  # the layers replace these arrays, never mutate them
    raise TypeError(f"the drafter cannot snapshot a {type(c).__name__}")


def _restore(c, saved):
    if isinstance(c, CacheList):
        for x, s in zip(c.caches, saved):
            _restore(x, s)
    elif isinstance(c, COMPACTING):
        c.offset = saved
    elif isinstance(c, RotatingKVCache):
        keys, c.offset, c._idx = saved
        c.keys, c.values = keys if keys is not None else (None, None)
    elif isinstance(c, ConcatenateKVCache):
        c.keys, c.values, c.offset = saved
    else:
        c.cache = list(saved)


def _logprobs(logits: mx.array) -> mx.array:
    """The draft's float32 log-probabilities, rows over the last axis: what
    every drafter ranks children by."""
    lp = logits.astype(mx.float32)
    return lp - mx.logsumexp(lp, axis=-1, keepdims=True)


def top_ids(logprobs: mx.array, k: int) -> mx.array:
    """Per row, the ids of the ``k`` largest values, largest first: every
    tree drafter's children. A partition, then a sort of the k: a full
    argsort of a 32000-token vocabulary took 7.2 ms per level on this CPU
    against 0.85 ms (3 rows, k 3); a [2,1,1,1] drafting round of the 256x4
    scaled pair went from 55.5 to 41.3 ms (scripts/tree_verify_costs.py)."""
    k = min(k, logprobs.shape[-1])
    if k == 1:
        return mx.argmax(logprobs, axis=-1, keepdims=True)
    ids = mx.argpartition(-logprobs, k - 1, axis=-1)[:, :k]
    values = mx.take_along_axis(logprobs, ids, axis=-1)
    return mx.take_along_axis(ids, mx.argsort(-values, axis=-1), axis=-1)


PREFILL_STEP = 2048  # mlx-lm generate_step's default, so caches match classic


def prefill(model, cache, tokens: Sequence[int], step: int = PREFILL_STEP):
    """Plain forwards over committed tokens, chunked as mlx-lm prefills."""
    tokens = list(tokens)
    for i in range(0, len(tokens), step):
        model(mx.array(tokens[i : i + step])[None], cache=cache)
        mx.eval([c.state for c in cache])


class Drafter:
    """The shared machinery; subclasses decide which nodes to expand.

    Two ways to keep the draft cache on the accepted path, chosen by cache
    type: caches of plain time-ordered rows (KVCache, QuantizedKVCache) are
    grown in parts and compacted in place; any other cache (sliding window,
    recurrent) is put back to the round's start and fed the accepted tokens
    in one forward, which costs one small draft forward per round."""

    kind = "base"

    def __init__(self):
        self.model = None
        self.cache = None
        self.pending: List[int] = []

    def start(self, model, prompt_without_root: Sequence[int], prefill_step_size=PREFILL_STEP):
        self.model = model
        self.adapter = adapter_for(model)
        self.cache = make_prompt_cache(model)
        self.compacting = all(isinstance(c, COMPACTING) for c in self.cache)
        self.pending = []
        self._step = prefill_step_size
        self._feed(prompt_without_root)

    def _feed(self, tokens: Sequence[int]):
        prefill(self.model, self.cache, tokens, self._step)

    # -- one round -------------------------------------------------------
    def draft(self, root: int, limit: Optional[int] = None) -> DraftRound:
        """Grow this round's tree below ``root``. ``limit`` caps the number
        of draft nodes (the round loop shrinks it near max_tokens)."""
        self._feed(self.pending)
        self.pending = []
        self._round_offset = cache_offset(self.cache)
        self._saved = None if self.compacting else [_save(c) for c in self.cache]
        self._fed_tree = DraftTree([root], [-1])
        self._logits, self._top = {}, {}
        self._expand([0])  # the root's distribution
        return self._grow(root, limit)

    def _expand(self, fed_nodes: List[int]):
        """Run the draft model over the newest fed-tree nodes; their
        ancestors are already in the cache (or are re-fed with them)."""
        start = fed_nodes[0]
        assert fed_nodes == list(range(start, len(self._fed_tree)))
        tree = self._fed_tree
        if tree.is_linear():
            # A chain is a plain forward: exactly mlx-lm's draft step.
            logits = self.model(mx.array(tree.tokens[start:])[None], cache=self.cache)[0]
        elif self.compacting:
            logits = self.adapter.verify(tree, self.cache, start=start)
        else:
            # Sliding-window and recurrent caches take a tree in one piece:
            # back to the round's start, then the whole fed tree again.
            for c, s in zip(self.cache, self._saved):
                _restore(c, s)
            logits = self.adapter.verify(tree, self.cache)[start:]
        logprobs = _logprobs(logits)
        k = self._top_needed()
        if k:
            # Every new node's top-k in one graph and one transfer: one sync
            # per level, not one per node (each costs a device round trip).
            order = top_ids(logprobs, k)
            top = mx.take_along_axis(logprobs, order, axis=-1)
            mx.eval(logprobs, order, top)
            for row, pairs in enumerate(zip(order.tolist(), top.tolist())):
                self._top[fed_nodes[row]] = list(zip(*pairs))
        else:
            mx.eval(logprobs)
        for row, node in enumerate(fed_nodes):
            self._logits[node] = logprobs[row]

    def _top_needed(self) -> int:
        """How many top children per expanded node to fetch with its
        logprobs (0: the subclass reads ``_logits`` itself)."""
        return 0

    def _grow(self, root, limit) -> DraftRound:
        raise NotImplementedError

    def commit(self, rnd: DraftRound, path: Sequence[int]):
        """Keep the accepted path in the draft cache; queue what it missed."""
        if not self.compacting:
            for c, s in zip(self.cache, self._saved):
                _restore(c, s)
            self.pending = [rnd.tree.tokens[n] for n in path]
            return
        fed_path = []
        for node in path:
            if rnd.fed[node] < 0:
                break
            fed_path.append(rnd.fed[node])
        if fed_path:  # a round that fed nothing (a root-only chain) left the cache as it was
            commit_path(self.cache, rnd.offset, fed_path, rnd.fed_tree)
        # Accepted nodes the draft never fed are committed text it must see.
        self.pending = [rnd.tree.tokens[n] for n in path[len(fed_path):]]

    def describe(self) -> dict:
        return {"kind": self.kind}


class ChainDrafter(Drafter):
    """A chain of ``block - 1`` greedy drafts: verify width ``block``."""

    kind = "chain"

    def __init__(self, block: int):
        super().__init__()
        if block < 1:
            raise ValueError(f"chain block must be >= 1 (the root alone), got {block}")
        self.block = block

    def budget(self) -> int:
        return self.block - 1

    def draft(self, root: int, limit: Optional[int] = None) -> DraftRound:
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
            self._saved = None if self.compacting else [_save(c) for c in self.cache]
        offset = cache_offset(self.cache) + len(first) - 1
        y, drafts = mx.array(first), []
        for _ in range(n):
            logits = self.model(y[None], cache=self.cache)[0, -1]
            y = mx.argmax(logits, axis=-1, keepdims=True)
            mx.async_eval(y)
            drafts.append(y)
        # The draft model was fed root .. d_{n-1}; the last draft never is.
        return DeviceRound(root, list(range(-1, n)), mx.concatenate(drafts) if drafts else None,
                           [i if i < n else -1 for i in range(n + 1)], offset)

    def describe(self):
        return {"kind": self.kind, "block": self.block, "budget": self.block - 1}

    def probe_shapes(self):
        return shapes_for(self.block)


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
            if not branching or any(int(b) < 1 for b in branching):
                raise ValueError(f"branching factors must be >= 1, got {list(branching)}")
            parents = [-1]
            level = [0]
            for b in branching:
                nxt = []
                for p in level:
                    for _ in range(int(b)):
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

    def draft(self, root: int, limit: Optional[int] = None) -> DraftRound:
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
        offset = cache_offset(self.cache) + len(first) - 1
        depths = DraftTree([0] * len(shape), shape).depths()
        internal = set(shape[1:])
        logits = self.model(mx.array(first)[None], cache=self.cache)[0, -1:]
        top = {0: self._device_top(logits)[0]}
        mx.async_eval(top[0])
        fed, fed_parents, token = [0] + [-1] * (len(shape) - 1), [-1], {}
        for d in range(1, int(depths.max()) + 1):
            level = [i for i in range(1, len(shape)) if depths[i] == d]
            rank = {}
            for i in level:  # the r-th child of a node is its r-th best token
                r = rank.get(shape[i], 0)
                rank[shape[i]] = r + 1
                token[i] = top[shape[i]][r : r + 1]
            expand = [i for i in level if i in internal]
            if expand:
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
        return DeviceRound(root, shape, drafts, fed, offset)  # the shape is in level order

    def _device_top(self, logits: mx.array) -> mx.array:
        """Per row, the ``_kmax`` best token ids, best first: ``_expand``'s
        ranking (``top_ids`` of float32 log-probabilities), left on the device."""
        return top_ids(_logprobs(logits), self._kmax)

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
        return DraftRound(tree, fed, self._round_offset, self._fed_tree)

    def describe(self):
        return {"kind": self.kind, "branching": self.branching, "budget": self.budget()}

    def probe_shapes(self):
        # The shape, and its prefixes (what a round cut short by max_tokens
        # verifies), after every chain up to its depth.
        depth = int(DraftTree([0] * len(self.shape), self.shape).depth())
        return shapes_for(depth + 1) + [tuple(self.shape[:m]) for m in range(2, len(self.shape) + 1)]


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
        if budget < 0 or width < 1:
            raise ValueError(f"need budget >= 0 and width >= 1, got {budget}, {width}")
        self._budget, self.width = budget, width
        self.depth = depth if depth is not None else max(1, budget)

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
        return DraftRound(tree, fed, self._round_offset, self._fed_tree, logprobs)

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


def fixed_shape(spec: Sequence[int]) -> dict:
    """``FixedTreeDrafter`` keywords for one fixed-shape spec: branching
    factors (all >= 1), or a parent list, told apart by its root's -1."""
    spec = [int(x) for x in spec]
    return {"parents": spec} if spec and spec[0] == -1 else {"branching": spec}


def shape_name(spec: Sequence[int]) -> str:
    """'[2,1,1]' for branching factors, 'p[-1,0,0,1,1]' for a parent list."""
    kind = "p" if "parents" in fixed_shape(spec) else ""
    return f"{kind}[" + ",".join(str(int(x)) for x in spec) + "]"


def make_drafter(mode: str, block: int = 4, branching=None, parents=None,
                 budget: Optional[int] = None, width: int = 4) -> Drafter:
    if mode == "chain":
        return ChainDrafter(block)
    if mode == "tree":
        if branching is not None or parents is not None:
            return FixedTreeDrafter(branching=branching, parents=parents)
        return ConfidenceDrafter(budget if budget is not None else block - 1, width=width)
    raise ValueError(f"no drafter for mode {mode!r}")
