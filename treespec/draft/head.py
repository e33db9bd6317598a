"""Drafting from a hidden-state head (treespec.heads.base): chains, fixed
trees and EAGLE-2's dynamic tree (treespec.draft.dynamic), fed the target's
own hidden states.

The features come at no extra forward: the round loop runs the target's
prefill and every verify inside ``drafter.watching(target)``, which taps the
layers the head reads (treespec.verify.taps). The head's input at position t
is the token at t + 1 with the target's features at t (MTP and EAGLE feed
them so): the drafter keeps those pairs the head has not seen yet
(``pending``), and every round starts with one head forward over them, whose
last row, the root's, gives the root's children.

The head's cache. Between rounds it holds the committed text's pairs up to
the one whose token is the previous root. A round's first forward appends
the pending pairs (the accepted tokens with the verifier's features for
them: "draft-extend") and the root's; drafting deeper feeds the head its
own hidden state (``own=True``): on the head's cache itself while the round's
fed nodes form one chain, past that as batch rows of one token over copies
of their parents' rows (no mask: every row holds its own root path, and all
rows of a depth share its position). After the target's walk, the cache is
trimmed back to the root's pair (``roll_back``) and the accepted path's
tokens are queued with the features the verify computed for their parents:
node i of the path gives the features of position i, the token after it is
node i + 1's (the last one, the target's bonus token, is the next root).
Design and checks: docs/heads.md#drafting-from-a-head.
"""

from contextlib import contextmanager
from typing import Optional, Sequence

import mlx.core as mx

from .. import caches
from ..checks import checked_branching, integer
from ..evidence.gate import shapes_for
from ..heads.base import tap_indices
from ..models import PREFILL_STEP, vocab_size
from ..options import branching_parents
from ..tree import DraftTree
from ..verify.taps import layer_home, tapped
from .base import DeviceRound, DraftRound, Drafter, Round, top_children
from .dynamic import dynamic_round, dynamic_shapes

__all__ = ["HeadDrafter", "head_refusal"]

DEFAULT_DEPTH = 6  # the dynamic tree's most depths (EAGLE-2's), fewer for a smaller budget


def head_refusal(head, target) -> Optional[str]:
    """Why ``head`` cannot draft for ``target`` (the contract's attributes
    missing, another vocabulary, taps outside its layers, another hidden
    size), or None: asked before anything runs."""
    for name in ("taps", "make_cache", "vocab_size", "target_hidden_size", "hidden_size"):
        if not hasattr(head, name):
            return f"it has no {name!r} (treespec.heads.base: a head's contract)"
    vocab = vocab_size(target)
    if head.vocab_size != vocab:
        return (f"its logits are {head.vocab_size} wide, the target's {vocab}: a head "
                "must return the target's vocabulary")
    try:
        home, layers = layer_home(target)
        tap_indices(tuple(head.taps), len(layers))
    except ValueError as e:
        return f"its taps {tuple(head.taps)}: {e}"
    embed = home.get("embed_tokens")  # its output's width (a graph, never evaluated)
    hidden = embed(mx.array([[0]])).shape[-1] if embed is not None else None
    if hidden is not None and head.target_hidden_size != hidden:
        return (f"it reads hidden states {head.target_hidden_size} wide, the target's are "
                f"{hidden}")
    return None


class _Levels:
    """A fixed shape, level by level, built once per size: each depth's
    nodes (in level order), where each node's token sits in the previous
    level's flattened top ids, and the nodes fed at that depth (those with
    children) with their parents' rows."""

    def __init__(self, parents: Sequence[int]):
        n = len(parents)
        self.topology = DraftTree([0] * n, parents)
        depth = [int(d) for d in self.topology.depths()]
        kids = [[i for i in range(1, n) if parents[i] == p] for p in range(n)]
        self.k = max((len(k) for k in kids), default=1)
        rank = {i: k.index(i) for k in kids for i in k}
        row = {0: 0}  # fed node -> its row in its level's forward
        self.levels, order = [], []
        for d in range(1, max(depth) + 1):
            nodes = [i for i in range(n) if depth[i] == d]
            fed = [i for i in nodes if kids[i]]
            source = mx.array([row[parents[i]] * self.k + rank[i] for i in nodes], dtype=mx.int32)
            fed_at = mx.array([row[parents[i]] * self.k + rank[i] for i in fed], dtype=mx.int32)
            rows = [row[parents[i]] for i in fed]
            self.levels.append((source, fed_at, rows))
            order += nodes
            row = {i: j for j, i in enumerate(fed)}
        # drafts in node order, from the levels' tokens concatenated
        self.order = mx.array([order.index(i) for i in range(1, n)], dtype=mx.int32)
        self.spine = [len(r) == 1 for _, _, r in self.levels]


class HeadDrafter(Drafter):
    """Draft from a hidden-state ``head`` (treespec.heads.base). ``mode``
    ``"chain"``: ``block - 1`` greedy drafts; ``"tree"`` with ``branching``
    or ``parents``: a fixed shape, a node's r-th child its r-th best token
    (treespec.draft.fixed's convention); ``"tree"`` without: EAGLE-2's
    dynamic tree of ``budget`` nodes (default ``block - 1``), expanding the
    ``width`` best frontier nodes per depth (default 4), at most ``depth``
    depths (default min(budget, ceil(budget / width) + 1, 6))."""

    reads_hidden = True

    def __init__(self, head, mode: str = "chain", block: Optional[int] = None,
                 branching=None, parents=None, budget: Optional[int] = None,
                 width: Optional[int] = None, depth: Optional[int] = None):
        super().__init__()
        self.head = head
        if mode == "chain":
            block = 4 if block is None else integer(block, "block")
            if block < 1:
                raise ValueError(f"chain block must be >= 1 (the root alone), got {block}")
            self.kind, self.shape = "chain", list(range(-1, block - 1))
        elif mode == "tree" and (branching is not None or parents is not None):
            if branching is not None and parents is not None:
                raise ValueError("give one fixed shape: branching or parents, not both")
            if branching is not None:
                branching = checked_branching(branching)
                parents = branching_parents(branching)
            self.kind = "fixed"
            self.shape = list(DraftTree([0] * len(parents), parents).parents)
            self.branching = branching
        elif mode == "tree":
            self.kind = "dynamic"
            budget = (budget if budget is not None
                      else (3 if block is None else integer(block, "block") - 1))
            self.budget_nodes = integer(budget, "budget")
            self.width = 4 if width is None else integer(width, "width")
            if self.budget_nodes < 0 or self.width < 1:
                raise ValueError(f"budget must be >= 0 and width >= 1, got {budget}, "
                                 f"{self.width}")
            # Deep enough for the budget's nodes spread ``width`` a depth, one
            # more for a spine; each depth is a head forward.
            spread = -(-self.budget_nodes // self.width) + 1
            self.depth = (max(1, min(self.budget_nodes, spread, DEFAULT_DEPTH)) if depth is None
                          else integer(depth, "depth"))
            if self.depth < 1:
                raise ValueError(f"depth must be >= 1, got {self.depth}")
        else:
            raise ValueError(f"no head drafter for mode {mode!r}")
        self._levels = {}
        self._taps = None  # what the latest watched forward recorded
        self._pool = {}  # the taps' stand-ins, the same ones every forward

    # -- the target's features -------------------------------------------
    def tap_list(self) -> tuple:
        """The target hidden states this drafter captures: the head's taps
        (a subclass may answer otherwise: the suites plant a wrong layer)."""
        return tuple(self.head.taps)

    @contextmanager
    def watching(self, target):
        """Record the head's taps of every target forward inside the block."""
        with tapped(target, self.tap_list(), self._pool) as t:
            yield t
        self._taps = t

    def _features(self, rows: Optional[int] = None) -> mx.array:
        if self._taps is None:
            raise ValueError("the head drafter saw no target forward (run the target's "
                             "prefill and verify inside drafter.watching(target))")
        f = self._taps.features()
        want = len(self.tap_list()) * self.head.target_hidden_size
        if f.shape[-1] != want:
            raise ValueError(f"the head reads {want} features per position "
                             f"({len(self.tap_list())} taps of {self.head.target_hidden_size}), "
                             f"the target's taps give {f.shape[-1]}: its hidden size differs")
        if rows is not None and f.shape[1] != rows:
            raise ValueError(f"the taps recorded {f.shape[1]} positions, the verify fed {rows}: "
                             "a forward other than the verify ran inside drafter.watching")
        self._taps = None
        return f

    # -- start, draft, commit --------------------------------------------
    def start(self, model, prompt_without_root: Sequence[int],
              prefill_step_size: int = PREFILL_STEP, adapter=None, kv=None):
        """Take the head (``model``) and the prompt's features, which the
        target's prefill recorded inside ``watching``; ``adapter`` and
        ``kv`` are the draft model's and do not apply (None expected)."""
        if adapter is not None:
            raise ValueError("draft_adapter: a head drafter runs no tree adapter of its own")
        if model is not self.head:
            raise ValueError("the head drafter's model must be its head")
        self.model, self.cache = model, model.make_cache()
        if self.kind != "chain" and not all(type(c).__name__ == "KVCache" for c in self.cache):
            names = ", ".join(sorted({type(c).__name__ for c in self.cache}))
            raise ValueError(f"draft_head: its caches ({names}) cannot be copied into the batch "
                             "rows a tree drafts with; draft a chain")
        prompt = list(prompt_without_root)
        # Position t's features go with token t + 1: the prompt's last token
        # pairs with the root, which the first round feeds.
        self.pending = prompt[1:]
        self._pending_features = self._features() if prompt else None
        self._fed = False

    def draft(self, root: int, limit: Optional[int] = None) -> Round:
        budget = self.budget() if limit is None else min(self.budget(), limit)
        if self._pending_features is None or budget < 1:
            # Nothing to draft from (the prompt's one token has no features
            # yet) or nothing to draft: the root alone, no head forward.
            self._fed = False
            return DraftRound(DraftTree([root], [-1]), [0], caches.offset(self.cache) or 0,
                              DraftTree([root], [-1]))
        tokens = mx.array(self.pending + [root], dtype=mx.int32)[None]
        logits, hidden = self.head(tokens, self._pending_features, self.cache)
        self._round_offset = caches.offset(self.cache)
        self._fed, self.pending, self._pending_features = True, [], None
        logits, hidden = logits[:, -1], hidden[:, -1]
        if self.kind == "dynamic":
            return self._dynamic_round(root, logits, hidden, budget)
        return self._fixed_round(root, logits, hidden, budget)

    def _dynamic_round(self, root, logits, hidden, budget) -> DraftRound:
        return dynamic_round(self, root, logits, hidden, budget)

    def levels(self, n: int) -> _Levels:
        """The first ``n`` nodes of the shape, level by level (built once)."""
        if n not in self._levels:
            self._levels[n] = _Levels(self.shape[:n])
        return self._levels[n]

    def _fixed_round(self, root, logits, hidden, budget) -> DeviceRound:
        n = budget + 1
        plan = self.levels(n)
        rows_cache, on_spine, drafted, forwards = self.cache, True, [], 1
        for d, (source, fed_at, rows) in enumerate(plan.levels):
            ids = (mx.argmax(logits, axis=-1, keepdims=True) if plan.k == 1
                   else top_children(logits, plan.k)[0]).reshape(-1)
            drafted.append(mx.take(ids, source))
            if not rows:
                break
            logits, hidden, rows_cache, on_spine = self._level_forward(
                plan, d, mx.take(ids, fed_at)[:, None], hidden, rows, rows_cache, on_spine)
            forwards += 1
        drafts = mx.take(mx.concatenate(drafted) if len(drafted) > 1 else drafted[0], plan.order)
        fed = [0] + [-1] * (n - 1)
        return DeviceRound(root, plan.topology, drafts, fed, self._round_offset, forwards)

    def _level_forward(self, plan, d: int, tokens: mx.array, hidden: mx.array, rows: list,
                       rows_cache, on_spine: bool):
        """One head forward over level ``d``'s fed nodes (``tokens``, (m, 1)),
        each reading the features of its parent's row ``rows[i]`` of
        ``hidden``: over the head's own cache while the levels are a spine,
        else over batch-row copies of the parents' rows. Returns (logits,
        hidden, the cache the next level reads, still on the spine)."""
        feats = (hidden if len(rows) == 1 and hidden.shape[0] == 1
                 else mx.take(hidden, mx.array(rows, dtype=mx.int32), axis=0))[:, None]
        on_spine = on_spine and plan.spine[d]
        if not on_spine:  # batch rows, each over a copy of its parent's row
            rows_cache = caches.fork(rows_cache, rows)
        logits, hidden = self.head(tokens, feats, rows_cache, own=True)
        return logits[:, -1], hidden[:, -1], rows_cache, on_spine

    def roll_back(self):
        """The head's cache back to the round's root pair (its drafts out)."""
        for c in self.cache:
            caches.mode_of(c).trim(c, self._round_offset)

    def path_features(self, features: mx.array, rnd: Round, path: Sequence[int]) -> mx.array:
        """The verify's features of the accepted path's nodes, ``(1, len(path), F)``."""
        return features[:, mx.array(list(path), dtype=mx.int32)]

    def commit(self, rnd: Round, path: Sequence[int]):
        """Roll the head's cache back and queue the accepted path's tokens
        with the verifier's features for the positions before them."""
        tokens, parents = rnd.tree.tokens, rnd.tree.parents
        if not path or path[0] != 0 or any(
                not 0 < b < len(parents) or parents[b] != a for a, b in zip(path, path[1:])):
            raise ValueError(f"path {list(path)} is not a root path of the round's tree "
                             f"(parents {list(parents)})")
        features = self.path_features(self._features(len(parents)), rnd, path)
        accepted = [tokens[n] for n in path[1:]]
        if self._fed:
            self.roll_back()
            self.pending, self._pending_features = accepted, features
        elif self._pending_features is None:
            self.pending, self._pending_features = accepted, features
        else:  # a root-only round: its root joins the queue
            self.pending = self.pending + [tokens[0]] + accepted
            self._pending_features = mx.concatenate([self._pending_features, features], axis=1)
        self._fed = False

    def budget(self) -> int:
        return self.budget_nodes if self.kind == "dynamic" else len(self.shape) - 1

    def describe(self) -> dict:
        out = {"kind": self.kind, "head": type(self.head).__name__, "budget": self.budget()}
        if self.kind == "chain":
            out["block"] = len(self.shape)
        elif self.kind == "fixed":
            out["branching"] = self.branching
        else:
            out.update(width=self.width, depth=self.depth)
        return out

    def probe_shapes(self, limit: Optional[int] = None) -> list:
        n = self.budget() if limit is None else min(self.budget(), limit)
        if self.kind == "dynamic":
            return dynamic_shapes(n, self.width)
        depth = int(DraftTree([0] * (n + 1), self.shape[:n + 1]).depth())
        return shapes_for(depth + 1) + [tuple(self.shape[:m]) for m in range(2, n + 2)
                                        if tuple(self.shape[:m]) != tuple(range(-1, m - 1))]
