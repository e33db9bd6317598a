"""Fixed-topology tree drafters (SpecInfer / Medusa style): the draft's
top-k children at each depth, k from a list of branching factors, or an
explicit parent list filled with the top-ranked children in node order.

Layout: the shape is kept in first-choice order (treespec.tree
``first_choice_order``): every node's best child right after it, so the path
of first choices is a prefix of the verified block and a round that accepts
it moves no cache row at commit. The draft feeds the shape level by level,
one draft forward per depth (its internal nodes at that depth in one batch):
on the device, a level whose fed nodes are not one chain goes in through the
tree injection, or, with ``batch_levels``, as batch rows of one token each
over the draft caches forked per row (``_Plan.rows``). Off by default: on
this project's CPU a batch level reads the history once per row, and costs
1.8x a one-token level at 2048 tokens of context against the injected
level's 1.3x (docs/drafting.md#wide-levels-as-batch-rows).
"""

from collections import Counter
from typing import Optional, Sequence

import mlx.core as mx

from .. import caches
from ..checks import checked_branching
from ..evidence.gate import shapes_for
from ..options import branching_parents
from ..tree import DraftTree, consecutive, first_choice_order, renumbered
from .base import DeviceRound, DraftRound, Drafter, Round, top_children


class _TopKTree(Drafter):
    """Trees whose candidates are the draft's top-k children per node."""

    def _children(self, node, k):
        """The draft's top ``k`` (token, logprob) at fed node ``node``, best
        first (fetched with the node's logprobs by ``_expand``)."""
        top = self._top[node]
        if k > len(top):
            raise ValueError(f"asked for {k} children, the drafter fetches {len(top)}")
        return top[:k]


class _Plan:
    """Everything about drafting the first ``n`` nodes of a shape that does
    not depend on token values, built once: the topology, each node's rank
    among its siblings, the nodes each level's forward feeds (its internal
    nodes, in node order) and the fed tree they form, how many top ids each
    level's rows need, and where each node's token sits among them."""

    def __init__(self, shape: Sequence[int]):
        n = len(shape)
        self.topology = DraftTree([0] * n, shape)
        depths = self.topology.depths()
        self.rank, seen = [0] * n, Counter()
        for i in range(1, n):
            self.rank[i], seen[shape[i]] = seen[shape[i]], seen[shape[i]] + 1
        internal = set(shape[1:])
        self.fed, fed_parents = [0] + [-1] * (n - 1), [-1]
        self.levels = []  # (depth nodes, fed nodes, fed tree so far, its start)
        for d in range(1, int(depths.max()) + 1 if n > 1 else 1):
            nodes = [i for i in range(1, n) if depths[i] == d]
            expand = [i for i in nodes if i in internal]
            start = len(fed_parents)
            for i in expand:
                self.fed[i] = len(fed_parents)
                fed_parents.append(self.fed[shape[i]])
            part = DraftTree([0] * len(fed_parents), fed_parents) if expand else None
            self.levels.append((nodes, expand, part, start))
        self.fed_topology = DraftTree([0] * len(fed_parents), fed_parents)
        # Each level's rows (the root's, then each depth's fed nodes) give
        # their children. The next level's forward waits only on the children
        # it feeds, so a level ranks now only as many ids as its fed children
        # need (``feed``: an argmax where each feeds its first choice, as a
        # chain's; 0 where it feeds none); the rest of the children (leaves
        # ranked past them: a spine's second choices) come from one ranking
        # at the round's end, over every row of the levels that have more
        # children than they feed, with as many ids as the most children one
        # of those rows has (``end_k``). A level's top ids are its rows' first
        # ids either way: the ranking is the same function of the same row.
        rows = [[0]] + [expand for _, expand, _, _ in self.levels if expand]
        children = [[i for i in range(1, n) if shape[i] in level] for level in rows]
        k = [max(seen[node] for node in level) for level in rows]  # children per row
        self.feed = [max([self.rank[i] + 1 for i in kids if i in internal], default=0)
                     for kids in children]
        self.end_levels = [r for r, (kr, f) in enumerate(zip(k, self.feed)) if kr > f]
        self.end_k = max((k[r] for r in self.end_levels), default=0)
        # Where each row's ids sit in the flat list of every level's fed ids
        # (levels in order, a level's rows contiguous), then the end's.
        feed_at, end_at, flat = {}, {}, 0
        for level, f in zip(rows, self.feed):
            for node in level:
                feed_at[node], flat = flat, flat + f
        for r in self.end_levels:
            for node in rows[r]:
                end_at[node], flat = flat, flat + self.end_k
        level_of = {node: r for r, level in enumerate(rows) for node in level}

        def source(i):  # node i's token in that flat list
            p = shape[i]
            if self.rank[i] < self.feed[level_of[p]]:
                return feed_at[p] + self.rank[i]
            return end_at[p] + self.rank[i]
        where = [source(i) for i in range(1, n)]
        self.gather_all = mx.array(where, dtype=mx.int32) if where else None
        # A level's tokens, gathered from the previous level's fed ids alone
        # (a node's parent sits one depth up), so the device never
        # concatenates the rows of every level per level.
        self.fed_levels = [(expand, part, start) for _, expand, part, start in self.levels
                           if expand]
        self.gather_level = []
        for (expand, _, _), previous in zip(self.fed_levels, rows):
            first = feed_at[previous[0]]
            idx = [feed_at[shape[i]] - first + self.rank[i] for i in expand]
            # Consecutive rows (a spine's one fed node, its first choice) are
            # a slice: no gather on the device.
            self.gather_level.append(consecutive(idx) or mx.array(idx, dtype=mx.int32))
        # Branches as batch rows: from the first level whose fed nodes are
        # not one chain on, each fed node is a batch row of one token over a
        # copy of its parent's row of the draft caches (caches.fork), so the
        # level is a plain forward (one position per row: every node of a
        # level has the same depth; no mask: a row holds only its own path).
        # ``rows[r]``: the previous fed level's row of each fed node's parent
        # (at the first wide level, the draft cache's one row), None where the
        # level keeps its rows (each row feeds one child: no copy) or is still
        # a chain in the draft cache. After the round the caches take back the
        # rows of the last level's first row (caches.adopt: its ancestors past
        # the chain, a round's first-choice path where the shape has one), so
        # ``adopted_fed`` numbers them after the chain and marks every other
        # node fed as a row unfed: a commit keeps the chain and that row's
        # accepted prefix and queues the rest of the accepted path.
        # ``branch_fed``: the same where the caches cannot adopt (none taken
        # back).
        self.rows, self.branch_fed = [], list(self.fed)
        previous, last = [0], None
        for expand, part, _ in self.fed_levels:
            if part.is_linear():
                self.rows.append(None)
            else:
                rows = tuple(previous.index(shape[i]) for i in expand)
                same = last is not None and rows == tuple(range(len(previous)))
                self.rows.append(None if same else rows)
                for i in expand:
                    self.branch_fed[i] = -1
                last = expand
            previous = expand
        self.wide = last is not None
        self.adopted_fed = list(self.branch_fed)
        if last is not None:
            lineage, node = [], last[0]
            while self.branch_fed[node] < 0:
                lineage.append(node)
                node = shape[node]
            kept = sum(f >= 0 for f in self.branch_fed)
            for j, node in enumerate(reversed(lineage)):
                self.adopted_fed[node] = kept + j


class FixedTreeDrafter(_TopKTree):
    """A fixed topology: ``branching[d]`` children for every node at depth d
    (top-k of the draft), or an explicit parent list whose shape is filled
    with the top-ranked children in node order (a node's k-th child is its
    k-th best token)."""

    kind = "fixed"

    def __init__(self, branching: Optional[Sequence[int]] = None,
                 parents: Optional[Sequence[int]] = None, batch_levels: bool = False):
        super().__init__()
        if not isinstance(batch_levels, bool):
            raise TypeError(f"batch_levels must be True or False, got {batch_levels!r}")
        # Wide levels of a device round as batch rows of forked draft caches
        # instead of through the injection (refused by start() where the
        # draft caches cannot fork).
        self.batch_levels = batch_levels
        if (branching is None) == (parents is None):
            raise ValueError("give exactly one of branching factors or parent lists")
        if branching is not None:
            branching = checked_branching(branching)
            parents = branching_parents(branching)
        # Validate the shape once, with placeholder tokens; keep it in
        # first-choice order, the order a round's tree is verified in, so
        # that the shapes the gate probes (prefixes of it) are the trees
        # verified.
        parents = list(DraftTree([0] * len(parents), parents).parents)
        self.shape = renumbered(parents, first_choice_order(parents))
        self.branching = list(branching) if branching is not None else None
        # The most children any node has: how many top tokens each expansion fetches.
        self._kmax = max(Counter(self.shape[1:]).values(), default=1)
        self._plans = {}

    def budget(self) -> int:
        return len(self.shape) - 1

    def _top_needed(self) -> int:
        return self._kmax

    def _plan(self, n: int) -> _Plan:
        if n not in self._plans:
            self._plans[n] = _Plan(self.shape[:n])
        return self._plans[n]

    def start(self, model, *args, **kwargs):
        super().start(model, *args, **kwargs)
        if self.batch_levels and not (self.on_device and self.compacting
                                      and caches.forks(self.cache)):
            why = ("its rounds are drafted on the host" if not self.on_device else
                   "its draft caches take a tree whole or cannot be forked into batch rows "
                   f"({', '.join(sorted({type(c).__name__ for c in self.cache}))})")
            self.model = self.cache = None
            raise ValueError(f"batch_levels: {why}; a wide level would go through the tree "
                             "injection anyway")

    # Children are the draft's top-k, a function of the logits alone: the
    # whole tree can be drafted on the device (SampledTreeDrafter draws its
    # children on the host and turns this off).
    on_device = True

    def draft(self, root: int, limit: Optional[int] = None) -> Round:
        n = len(self.shape) if limit is None else min(len(self.shape), limit + 1)
        if self.on_device and n > 1:
            return self._draft_on_device(root, self._plan(n))
        return super().draft(root, limit)

    def _draft_on_device(self, root: int, plan: _Plan) -> DeviceRound:
        """The same tree as ``_grow``, with no host round trip: one draft
        forward per level, on the lazy tokens of that level's internal nodes,
        gathered in one op from the fed nodes' device top-k. A growing cache
        continues the fed tree (a plain one-token forward while the fed
        nodes form a chain, as a spine's do); past that, the tree injection
        alone (``Drafter.inject_level``), or with ``batch_levels``, each fed
        node a batch row of one token over
        its parent's row of the forked caches (a plain forward with no mask
        and one position per row, the backend's one-token attention; the
        caches take back the first row's rows: ``_Plan.adopted_fed``). A
        cache that must take a tree whole (sliding window, recurrent) is put
        back to the round's start and fed the fed tree so far again, still
        one forward a level."""
        lead = self._start_round()
        offset = self._round_offset
        logits = self.model(mx.array(lead + [root])[None], cache=self.cache)[0, -1:]
        rows, fed_ids = [logits], []  # every level's logits; each level's fed ids
        fed_tokens = mx.array([root], dtype=mx.uint32)  # the dtype of argmax's ids
        owners = None
        batched = self.batch_levels and plan.wide  # start() checked the caches fork
        branches = self.cache
        for r, ((expand, part, start), gather) in enumerate(zip(plan.fed_levels,
                                                                plan.gather_level)):
            # This level's tokens: the previous level's fed ids, ranked now
            # and started now, as the chain starts each draft (the device
            # runs that level while the host builds this one).
            top = self._device_top(logits, plan.feed[r])
            mx.async_eval(top)
            fed_ids.append(top)
            tokens = top[gather] if type(gather) is slice else mx.take(top, gather)
            if not self.compacting:
                fed_tokens = mx.concatenate([fed_tokens, tokens])
            if part.is_linear():
                # Still a chain (a spine's fed nodes): one new token, exactly
                # the chain drafter's step, for every cache mode.
                # squeeze, a view: an int index ([0]) would gather the rows
                logits = self.model(tokens[None], cache=self.cache).squeeze(0)
            elif batched:
                if plan.rows[r] is not None:
                    branches = caches.fork(branches, plan.rows[r])
                logits = self.model(tokens[:, None], cache=branches).squeeze(1)
            elif self.compacting:
                if owners is None:  # the round's first wide level: checked once
                    owners = self.adapter.check(part, self.cache, start)
                logits = self.inject_level(part, start, tokens, owners)
            else:
                self._restore()
                logits = self.adapter.verify(part, self.cache, tokens=fed_tokens)[start:]
            rows.append(logits)
        # The children past what each level fed (leaves), every level at
        # once, started now: the last level's forward runs while the host
        # builds the verify.
        end = [rows[r] for r in plan.end_levels]
        if end:
            end = mx.concatenate(end) if len(end) > 1 else end[0]
            fed_ids.append(self._device_top(end, plan.end_k))
            mx.async_eval(fed_ids[-1])
        drafts = mx.take(mx.concatenate(fed_ids) if len(fed_ids) > 1 else fed_ids[0],
                         plan.gather_all)
        fed = plan.fed
        if batched:
            # Lazy writes, evaluated with the next round's first draft forward.
            adopted = caches.adopts(self.cache)
            if adopted:
                caches.adopt(self.cache, branches, 0)
            fed = plan.adopted_fed if adopted else plan.branch_fed
        return DeviceRound(root, plan.topology, drafts, fed, offset,
                           forwards=1 + len(plan.fed_levels))

    def _device_top(self, logits: mx.array, k: int) -> mx.array:
        """Per row, the ``k`` best token ids, best first, rows one after the
        other: ``_expand``'s ranking (``top_children``), left on the device.
        For k = 1 the argmax of the logits as they are, the chain's op: their
        float32 cast, which ``top_children`` ranks, is exact and keeps the
        order, so it is the same id (ties to the lower id in both)."""
        if k == 1:
            return mx.argmax(logits, axis=-1)
        return top_children(logits, k)[0].reshape(-1)

    def _grow(self, root, limit) -> DraftRound:
        n = len(self.shape) if limit is None else min(len(self.shape), limit + 1)
        plan, shape = self._plan(n), self.shape
        tokens, fed = [root] + [0] * (n - 1), [0] + [-1] * (n - 1)
        for nodes, expand, _, _ in plan.levels:
            for i in nodes:  # the r-th child of a node is its r-th best token
                r = plan.rank[i]
                tokens[i] = self._children(fed[shape[i]], r + 1)[r][0]
            if expand:  # one draft forward expands this level's internal nodes
                first = len(self._fed_tree)
                for i in expand:
                    fed[i] = self._fed_tree.push_child(fed[shape[i]], tokens[i])
                self._expand(list(range(first, len(self._fed_tree))))
        tree = plan.topology.with_tokens(tokens)
        return DraftRound(tree, fed, self._round_offset, self._fed_tree, forwards=self._forwards)

    def describe(self):
        out = {"kind": self.kind, "branching": self.branching, "budget": self.budget()}
        if self.batch_levels:
            out["batch_levels"] = True
        return out

    def probe_shapes(self, limit: Optional[int] = None):
        # The shape, and its prefixes (what a round cut short by max_tokens
        # verifies), after every chain up to its depth.
        n = len(self.shape) if limit is None else min(len(self.shape), limit + 1)
        depth = int(DraftTree([0] * n, self.shape[:n]).depth())
        return shapes_for(depth + 1) + [tuple(self.shape[:m]) for m in range(2, n + 1)]


def fixed_shape(spec: Sequence[int]) -> dict:
    """``FixedTreeDrafter`` keywords for one fixed-shape spec: branching
    factors (all >= 1), or a parent list, told apart by its root's -1."""
    spec = [int(x) for x in spec]
    return {"parents": spec} if spec and spec[0] == -1 else {"branching": spec}


def shape_name(spec: Sequence[int]) -> str:
    """'[2,1,1]' for branching factors, 'p[-1,0,0,1,1]' for a parent list."""
    kind = "p" if "parents" in fixed_shape(spec) else ""
    return f"{kind}[" + ",".join(str(int(x)) for x in spec) + "]"
