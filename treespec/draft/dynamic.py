"""EAGLE-2's dynamic draft tree from a hidden-state head.

Per depth, the ``width`` frontier nodes with the highest cumulative draft
log-probability are expanded, each into its ``width`` best children, in one
head forward (the frontier as batch rows of one token, each over a copy of
its parent's row of the head's cache, fed its parent's own hidden state).
The root's children come from the round's first head forward; depth d + 1's
candidates from depth d's frontier. Every scored candidate is kept on the
device until the end, where one transfer reads them and the ``budget`` best
by cumulative log-probability are kept (Li et al., EAGLE-2, section 4.2).

Why the kept set is a tree: a child's cumulative log-probability is its
parent's plus a log-probability <= 0, so a kept child's parent scores at
least as high; on a tie the stable sort keeps the parent, created first.

At temperature > 0 (:func:`sampled_dynamic_round`) the children are drawn
instead, and the tree is never pruned after the draw: the multi-draft rule
(treespec.sampling_rule) is exact only where each node's children are the
first draws without replacement from its q, their number fixed before they
are drawn. Keeping the budget best of all candidates would keep a node's
children by their own values (its likeliest draws), a law the rule does not
correct. What the rule allows, and the sampled tree uses: which nodes get
children, and how many, may depend on anything drawn before them (their own
token and score, their siblings' and cousins'), because the rule at a node
reads only its own children's tokens and its own coins, and a node's
children are drawn from fresh randomness whatever decided their count.
"""

import random
from typing import Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from ..evidence.gate import shapes_for
from ..tree import DraftTree
from .base import DraftRound, top_children

__all__ = ["dynamic_round", "dynamic_shapes", "sampled_dynamic_round", "take_rows"]


def take_rows(cache: Sequence, rows: mx.array) -> list:
    """The head's cache list as ``len(rows)`` batch rows, row i a copy of
    row ``rows[i]`` (a device array: the frontier chosen on the device); the
    list given is untouched. Plain KVCache only (a head's attention cache)."""
    out = []
    for c in cache:
        if type(c) is not KVCache:
            raise ValueError(f"a head's {type(c).__name__} cannot be copied into batch rows")
        f = KVCache()
        f.offset = c.offset
        if c.keys is not None:
            f.keys = mx.take(c.keys[..., :c.offset, :], rows, axis=0)
            f.values = mx.take(c.values[..., :c.offset, :], rows, axis=0)
        out.append(f)
    return out


def dynamic_round(drafter, root: int, logits: mx.array, hidden: mx.array,
                  budget: int) -> DraftRound:
    """One round of the dynamic tree: ``logits`` / ``hidden`` (1, ...) are
    the root's row of the round's first head forward; ``budget`` the most
    draft nodes kept. Host-side: the kept tree (one transfer at the end)."""
    head, depth = drafter.head, drafter.depth
    k = min(drafter.width, logits.shape[-1])
    ids, scores = top_children(logits, k)  # (1, k): depth 1, the root's children
    ids, scores = ids.reshape(-1), scores.reshape(-1)
    tokens, cum, parent = [ids], [scores], [mx.full((ids.shape[0],), -1, mx.int32)]
    front = mx.arange(ids.shape[0], dtype=mx.int32)  # frontier: candidate indices
    front_rows = mx.zeros((ids.shape[0],), dtype=mx.int32)  # their parents' rows
    front_scores, front_tokens, base = scores, ids, 0
    rows_cache, feats, forwards = drafter.cache, hidden, 1
    for _ in range(depth - 1):
        rows_cache = take_rows(rows_cache, front_rows)
        logits, hidden = head(front_tokens[:, None], mx.take(feats, front_rows, axis=0)[:, None],
                              rows_cache, own=True)
        logits, feats = logits[:, -1], hidden[:, -1]
        forwards += 1
        ids, lp = top_children(logits, k)  # (f, k)
        total = (front_scores[:, None] + lp).reshape(-1)
        ids = ids.reshape(-1)
        base += tokens[-1].shape[0]
        tokens.append(ids)
        cum.append(total)
        parent.append(mx.repeat(front, k))
        # The next frontier: the k best of these children, on the device.
        pick = mx.argsort(-total)[:k].astype(mx.int32)
        front_rows = pick // k
        front, front_scores, front_tokens = base + pick, mx.take(total, pick), mx.take(ids, pick)
        mx.async_eval(front_tokens, front_rows)
    tokens, cum, parent = (mx.concatenate(x) for x in (tokens, cum, parent))
    mx.eval(tokens, cum, parent)
    tokens, cum, parent = tokens.tolist(), cum.tolist(), parent.tolist()
    # The budget best, stable (ties keep creation order, parents first).
    kept = sorted(sorted(range(len(cum)), key=lambda i: -cum[i])[:budget])
    node = {c: j + 1 for j, c in enumerate(kept)}
    tree = DraftTree([root] + [tokens[c] for c in kept],
                     [-1] + [0 if parent[c] < 0 else node[parent[c]] for c in kept])
    rnd = DraftRound(tree, [0] + [-1] * len(kept), drafter._round_offset,
                     DraftTree([root], [-1]), forwards=forwards)
    rnd.logprobs = {j + 1: cum[c] for j, c in enumerate(kept)}
    return rnd


def sampled_dynamic_round(drafter, root: int, logits: mx.array, hidden: mx.array, budget: int,
                          probs, draw):
    """The dynamic tree at temperature > 0 (see the module docstring):
    ``(round, q)``, ``q`` the distribution each node with children drew
    them from. ``probs(logits)``: the processed draft distributions of a
    head forward's rows (numpy [rows, V]); ``draw(q, k)``: each row's first
    ``k`` draws without replacement, in draw order, -1 past its support
    (treespec.sampling_rule.sample_without_replacement). Per depth, every
    frontier node draws ``width`` children, as many as the ``budget`` still
    allows in frontier order (so a count is fixed before its draws); the
    next frontier is the ``width`` new nodes of highest cumulative draft
    log-probability, fed to the head in one forward, as greedy."""
    head, k = drafter.head, min(drafter.width, logits.shape[-1])
    tokens, parents, cum, q_of = [root], [-1], [0.0], {}
    q, frontier = probs(logits), [0]  # the nodes q's rows belong to
    rows_cache, feats, forwards = drafter.cache, hidden, 1
    for d in range(drafter.depth):
        order, new = draw(q, k), []
        for r, node in enumerate(frontier):
            for t in order[r][: budget - (len(tokens) - 1)]:
                if t < 0:  # past q's support
                    break
                q_of[node] = q[r]
                new.append((len(tokens), r))
                tokens.append(int(t))
                parents.append(node)
                cum.append(cum[node] + float(np.log(q[r][t])))
        if d + 1 == drafter.depth or len(tokens) - 1 >= budget or not new:
            break
        best = sorted(new, key=lambda x: -cum[x[0]])[:k]  # stable: ties in creation order
        frontier = [n for n, _ in best]
        pick = mx.array([r for _, r in best], dtype=mx.int32)  # their parents' rows
        rows_cache = take_rows(rows_cache, pick)
        fed = mx.array([tokens[n] for n in frontier], dtype=mx.int32)[:, None]
        logits, hidden = head(fed, mx.take(feats, pick, axis=0)[:, None], rows_cache, own=True)
        logits, feats = logits[:, -1], hidden[:, -1]
        q, forwards = probs(logits), forwards + 1
    rnd = DraftRound(DraftTree(tokens, parents), [0] + [-1] * (len(tokens) - 1),
                     drafter._round_offset, DraftTree([root], [-1]), forwards=forwards)
    rnd.logprobs = {i: cum[i] for i in range(1, len(tokens))}
    return rnd, q_of


def dynamic_shapes(budget: int, width: int) -> list:
    """The shapes a dynamic tree of at most ``budget`` nodes may verify
    change every round: as the confidence tree's probe (treespec.draft.
    confidence), every node count with a chain and a seeded tree of this
    width."""
    shapes = shapes_for(budget + 1)
    rng = random.Random(budget * 1000 + width)
    for m in range(3, budget + 2):
        parents = [-1]
        for i in range(1, m):
            parents.append(rng.choice([p for p in range(i) if parents.count(p) < width]))
        shapes.append(tuple(parents))
    return shapes
