"""The confidence-driven tree drafter (EAGLE-2's dynamic tree): grow by
cumulative draft log-probability, one draft forward per depth, and keep the
``budget`` best candidates.

The definition (what both paths below compute; suites/e2e pins them equal):

- score: a candidate's cumulative draft log-probability, a float32 sum along
  its path of the float32 log-softmax of the draft's logits;
- a node's ``width`` best children: the largest of its float32 logits, ties
  to the lower id (``treespec.draft.base.top_children``);
- depth 1: the root's ``width`` best children are the candidates, and all of
  them are the frontier;
- depth d + 1 (d = 1 .. depth - 1): every frontier node of depth d offers its
  ``width`` best children, ``width**2`` candidates; the new frontier is their
  ``width`` best (score, ties to the earlier created);
- creation order: depth by depth; within a depth, by the frontier rank of the
  parent, then the child's rank;
- the tree: the ``budget`` best candidates of all depths (score, ties to the
  earlier created). A child's score never exceeds its parent's and it is
  created later, so the set is ancestor-closed.

What is fed and ranked is less than that definition expands, for the same
tree. Only the first ``expanded(budget, width, d) = min(width, budget - d)``
frontier nodes of depth d go through the draft forward, and every node of
depth d (the root's is 0) offers only its ``offered(budget, width, d) =
min(width, budget - d)`` best children. Why that loses nothing: a kept node
of depth d + 1 needs its d ancestors kept and, being a child of rank r, its
r - 1 better siblings (each scores at least as much and was created
earlier), so r <= budget - d; and at most budget - d nodes of depth d have a
kept child; those are kept, hence the best of their depth, hence (the
frontier being best first) among its first budget - d. A child left out has
budget - d better siblings in its level, so it is past the fed part of the
next frontier too. Taking candidates that are never kept nor fed out of the
set changes neither the kept set nor, creation order being kept, any tie. A
budget-4 tree of width 4 feeds 3, 2 and 1 nodes past the root instead of 4,
4 and 4 (fewer tokens per draft forward, where a forward's cost grows with
its tokens) and ranks 4, 3, 2 and 1 children per node of depth 0 to 3
instead of 4 each (docs/drafting.md#what-a-tree-round-costs has the
measured drafting cost).

``depth`` defaults to the budget (the deepest a budget-node tree can reach),
so drafting costs one draft forward per depth, as a chain of that depth (the
root's forward and one per frontier). A budget-n tree is the top n of a
budget-N tree's candidates for n <= N (a node of depth k needs k nodes, and
the candidates of depth <= n do not depend on deeper ones): what treespec.auto.choose
reads off one calibration budget.

On a growing draft cache the whole round stays on the device (each frontier's
ancestry mask and positions built there) and one evaluation reads the
candidates back; other caches (sliding window, recurrent) take the host path,
one evaluation per depth. The tree is laid out in first-choice order
(treespec.tree.first_choice_order) and ``logprobs`` lists its nodes in rank
order.
"""

import random
from typing import List, Optional

import mlx.core as mx
import numpy as np

from ..checks import integer
from ..evidence.gate import shapes_for
from ..tree import DraftTree
from ..verify.attention import injected
from .base import DraftRound, top_children
from .fixed import _TopKTree


def build_tree(root: int, tokens: List[int], scores: List[float], parents: List[int],
               fed_of: dict, budget: int):
    """The ``budget`` best candidates as a tree in first-choice order.

    Candidates are in creation order: ``tokens[c]``, ``scores[c]``,
    ``parents[c]`` (a candidate index, -1 for the root); ``fed_of[c]`` the
    fed index of a candidate the draft fed. Returns (tree, fed, logprobs)."""
    ranked = sorted(range(len(tokens)), key=lambda c: (-scores[c], c))[:budget]
    children = {-1: []}
    for c in ranked:  # in rank order: every node's children best first
        children.setdefault(parents[c], []).append(c)
        children.setdefault(c, [])
    order, stack = [], [-1]
    while stack:
        c = stack.pop()
        order.append(c)
        stack.extend(reversed(children[c]))
    where = {c: k for k, c in enumerate(order)}
    tree = DraftTree([root] + [tokens[c] for c in order[1:]],
                     [-1] + [where[parents[c]] for c in order[1:]])
    fed = [0] + [fed_of.get(c, -1) for c in order[1:]]
    logprobs = {0: 0.0}
    for c in ranked:
        logprobs[where[c]] = scores[c]
    return tree, fed, logprobs


def expanded(budget: int, width: int, d: int) -> int:
    """How many of depth d's frontier (best first) a round feeds: those that
    can have a kept child (the module docstring says why no more)."""
    return min(width, budget - d)  # >= 1: d < depth <= budget


def offered(budget: int, width: int, d: int) -> int:
    """How many of its best children a node of depth d (the root: 0) offers
    as candidates: those that can be kept (the module docstring says why no
    more)."""
    return min(width, budget - d)  # >= 1: d < depth <= budget


def best_first(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` best scores, best first, ties to the lower index."""
    return np.lexsort((np.arange(scores.size), -scores))[:k]


class ConfidenceDrafter(_TopKTree):
    """EAGLE-2 style: per depth, expand the ``width`` best candidates of that
    depth in one draft forward; keep the ``budget`` best of all (the module
    docstring has the exact definition)."""

    kind = "confidence"

    def __init__(self, budget: int, width: int = 4, depth: Optional[int] = None):
        super().__init__()
        budget, width = integer(budget, "budget"), integer(width, "width")
        if budget < 0 or width < 1:
            raise ValueError(f"need budget >= 0 and width >= 1, got {budget}, {width}")
        if depth is not None and depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._budget, self.width = budget, width
        self._shape_constants = {}  # (budget, width, depth) -> _constants
        self.depth = integer(depth, "depth", 1) if depth is not None else max(1, budget)

    # Children are the draft's top-k and the frontier its best candidates,
    # functions of the logits alone: drafted on the device where the cache
    # grows in parts.
    on_device = True

    def budget(self) -> int:
        return self._budget

    def _top_needed(self) -> int:
        return self.width

    def _sizes(self, limit):
        budget = self._budget if limit is None else min(self._budget, limit)
        return budget, min(self.depth, budget)

    def draft(self, root: int, limit: Optional[int] = None):
        budget, depth = self._sizes(limit)
        if self.on_device and self.compacting and budget > 0:
            return self._draft_on_device(root, budget, depth)
        return super().draft(root, limit)

    # -- the host path: one evaluation per depth -----------------------------
    def _grow(self, root, limit) -> DraftRound:
        budget, depth = self._sizes(limit)
        tokens, scores, parents, fed_of = [], [], [], {}
        if budget == 0:
            return DraftRound(DraftTree([root], [-1]), [0], self._round_offset,
                              self._fed_tree, {0: 0.0}, forwards=self._forwards)
        frontier = []  # candidate indices, best first
        w = min(self.width, len(self._top[0]))  # a vocabulary smaller than the width
        for tok, lp in self._children(0, offered(budget, w, 0)):
            frontier.append(len(tokens))
            tokens.append(tok), scores.append(np.float32(lp)), parents.append(-1)
        for d in range(1, depth):
            frontier = frontier[:expanded(budget, w, d)]
            first = len(self._fed_tree)
            for c in frontier:
                fed_of[c] = self._fed_tree.push_child(
                    0 if parents[c] < 0 else fed_of[parents[c]], tokens[c])
            self._expand(list(range(first, len(self._fed_tree))))
            level = []
            for c in frontier:
                for tok, lp in self._children(fed_of[c], offered(budget, w, d)):
                    level.append(len(tokens))
                    # float32 arithmetic, as the device path sums
                    tokens.append(tok), scores.append(scores[c] + np.float32(lp))
                    parents.append(c)
            level_scores = np.array([scores[c] for c in level], dtype=np.float32)
            frontier = [level[i] for i in best_first(level_scores, w)]
        tree, fed, logprobs = build_tree(root, tokens, [float(x) for x in scores], parents,
                                         fed_of, budget)
        return DraftRound(tree, fed, self._round_offset, self._fed_tree, logprobs,
                          forwards=self._forwards)

    # -- the device path: one evaluation per round ---------------------------
    def _draft_on_device(self, root: int, budget: int, depth: int) -> DraftRound:
        """The host path's tree with no host round trip per depth: the
        frontier (tokens, scores, which parent) stays on the device; each
        depth's forward feeds it with its ancestry mask (history, the root,
        one ancestor per earlier depth, itself) and the position of its
        depth; one evaluation at the end reads every candidate back."""
        owners = self.adapter.check(DraftTree([root, root], [-1, 0]), self.cache)
        lead = self._start_round()
        offset = self._round_offset
        logits = self.model(mx.array(lead + [root])[None], cache=self.cache)[0, -1:]
        w = min(self.width, logits.shape[-1])  # a vocabulary smaller than the width
        c = offered(budget, w, 0)
        ids, lp = top_children(logits, c)
        f_tok, f_score = ids[0], lp[0]
        (f_cand, f_anc, root_parents), levels = self._constants(budget, w, depth)
        tokens, scores = [f_tok], [f_score]
        parents, frontiers, sizes = [root_parents], [], []
        count = c
        for d, (itself, depths, earlier) in enumerate(levels, start=1):
            k = expanded(budget, w, d)  # best first: the first k can have kept children
            f_tok, f_score, f_cand, f_anc = f_tok[:k], f_score[:k], f_cand[:k], f_anc[:k]
            frontiers.append(f_cand)
            mask = mx.concatenate([f_anc, itself], axis=1)  # ... and itself
            logits = self._forward_frontier(f_tok, mask, offset, d, sizes, depths, owners)
            sizes.append(k)
            c = offered(budget, w, d)
            ids, lp = top_children(logits, c)
            level_score = (f_score[:, None] + lp).reshape(-1)
            level_tok = ids.reshape(-1)
            level_parent = mx.repeat(f_cand, c)
            tokens.append(level_tok), scores.append(level_score), parents.append(level_parent)
            first, count = count, count + k * c  # this level's candidates: first .. count - 1
            if d == depth - 1:
                break  # the deepest level: its candidates feed no forward, no frontier
            # The w best of the level's k*c, ties to the earlier created: rank
            # each candidate by how many beat it, then take ranks 0 .. w-1.
            s = level_score
            beats = (s[None, :] > s[:, None]) | ((s[None, :] == s[:, None]) & earlier)
            pick = mx.argsort(beats.sum(axis=1))[:w].astype(mx.int32)
            f_anc = mx.take(mask, pick // c, axis=0)
            f_tok, f_score = mx.take(level_tok, pick), mx.take(level_score, pick)
            f_cand = first + pick
            mx.async_eval(f_tok, f_score, f_anc)
        flat_tok = mx.concatenate(tokens)
        flat_score = mx.concatenate(scores)
        flat_parent = mx.concatenate(parents)
        fed_cands = mx.concatenate(frontiers) if frontiers else mx.zeros((0,), mx.int32)
        mx.eval(flat_tok, flat_score, flat_parent, fed_cands)
        fed_of = {c: 1 + k for k, c in enumerate(fed_cands.tolist())}
        tree, fed, logprobs = build_tree(root, flat_tok.tolist(), flat_score.tolist(),
                                         flat_parent.tolist(), fed_of, budget)
        fed_tree = _fed_tree(root, flat_tok.tolist(), flat_parent.tolist(), fed_of)
        return DraftRound(tree, fed, offset, fed_tree, logprobs, forwards=depth)

    def _constants(self, budget: int, w: int, depth: int):
        """What a device round of this budget, width and depth builds from
        its sizes alone, built once per shape: evaluated with the first
        round's graph (no evaluation of their own: a round stays one), after
        which every round's graph holds them as evaluated inputs. The root
        level's (the frontier's candidate
        indices 0..c-1, its ancestry among the fed rows (the root), the
        candidates' parent -1), then per depth d = 1 .. depth - 1 (the mask
        of each frontier node seeing itself; the rope's depths, each node at
        ``offset + d`` while the model hands its rope the cache offset,
        ``offset`` + the rows fed before; [i, j]: candidate j created before
        candidate i, the tie-break of the frontier's ranking, None at the
        deepest level, which ranks no frontier)."""
        key = (budget, w, depth)
        if key not in self._shape_constants:
            c = offered(budget, w, 0)
            root = (mx.arange(c, dtype=mx.int32), mx.ones((c, 1), dtype=mx.bool_),
                    mx.full((c,), -1, dtype=mx.int32))
            levels, fed_before = [], 1
            for d in range(1, depth):
                k, c = expanded(budget, w, d), offered(budget, w, d)
                order = mx.arange(k * c)
                levels.append((mx.eye(k, dtype=mx.bool_),
                               mx.full((k,), d - fed_before, dtype=mx.int32),
                               order[None, :] < order[:, None] if d < depth - 1 else None))
                fed_before += k
            self._shape_constants[key] = root, levels
        return self._shape_constants[key]

    def _forward_frontier(self, tokens: mx.array, mask: mx.array, offset: int, d: int,
                          sizes: List[int], depths: mx.array, owners) -> mx.array:
        """One draft forward over a frontier of depth ``d`` (its nodes all at
        position ``offset + d``; ``depths``: that position less the cache
        offset the model hands its rope), continuing the cache past its fed
        rows (the root, then ``sizes[j]`` nodes of depth j + 1): each node
        sees the history and ``mask``'s fed rows."""
        n = tokens.shape[0]
        history = offset

        def mask_fn(cache, N, window):
            if N != n:
                raise RuntimeError(f"make_mask asked for {N} queries, the frontier feeds {n}")
            if window is not None:
                # Counted in positions, as DraftTree.mask_np: the fed rows
                # sit at offset + their depth.
                kdepth = np.concatenate([[0]] + [[j + 1] * m for j, m in enumerate(sizes)]
                                        + [[d] * n]).astype(np.int64)
                kpos = np.concatenate([np.arange(offset - history, offset), offset + kdepth])
                near = mx.array((offset + d) - kpos < window)[None, :]
                hist = mx.ones((n, history), dtype=mx.bool_)
                return mx.concatenate([hist, mask], axis=1) & near
            return mx.concatenate([mx.ones((n, history), dtype=mx.bool_), mask], axis=1)

        # positions=[]: this path runs only where the adapter feeds trees in
        # parts, i.e. where no module receives per-position values (the walk
        # for them would find none, once per depth)
        with self.level_turn(), injected(self.model, self.cache, depths, mask_fn,
                                         self.adapter.family.rope_attr, owners,
                                         positions=[], rope_pool=self.adapter.rope_pool) as probe:
            logits = self.model(tokens[None], cache=self.cache).squeeze(0)
            probe()
        return logits

    def describe(self):
        return {"kind": self.kind, "budget": self._budget, "width": self.width,
                "depth": self.depth}

    def probe_shapes(self, limit: Optional[int] = None):
        # Its shapes change every round; the backend's kernel choice follows
        # M (the node count), so probe every M with a chain and a seeded
        # branching tree of this drafter's width. A ``limit`` keeps the first
        # of these (the same seeded trees), up to what a round can verify.
        top = self._budget + 1 if limit is None else min(self._budget, limit) + 1
        shapes = shapes_for(top)
        rng = random.Random(self._budget * 1000 + self.width)
        for m in range(3, top + 1):
            parents = [-1]
            for i in range(1, m):
                options = [p for p in range(i) if parents.count(p) < self.width]
                parents.append(rng.choice(options))
            shapes.append(tuple(parents))
        return shapes


def _fed_tree(root, tokens, parents, fed_of) -> DraftTree:
    """The fed tree of a device round: the root, then the fed candidates in
    fed order."""
    order = sorted(fed_of, key=fed_of.get)
    return DraftTree([root] + [tokens[c] for c in order],
                     [-1] + [0 if parents[c] < 0 else fed_of[parents[c]] for c in order])
