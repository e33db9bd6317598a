"""The drafters' shared machinery: a round's tree, the draft model's cache,
and committing the accepted path into it.

A drafter owns the draft model's cache. Between rounds that cache holds the
committed text except the root (the last committed token), exactly like the
target's. Drafting feeds the root and the nodes it expands into the cache;
``commit`` keeps only accepted ones, and remembers the accepted tokens the
cache does not keep so the next round feeds them first.

Two ways to keep the draft cache on the accepted path, chosen by cache mode
(``treespec.caches``): caches of plain time-ordered rows (KVCache,
QuantizedKVCache) are grown in parts and, at commit, trimmed to the accepted
path's longest prefix of the fed order (no row moves, nothing evaluated; the
accepted nodes past it are fed again with the next root, in the one forward
the next round starts with anyway); any other cache (sliding window,
recurrent) is put back to the round's start and fed the accepted tokens in
one forward, one small draft forward per round.
"""

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import List, Optional, Protocol, Sequence

import mlx.core as mx

from .. import caches, kv_options as kv_caches
from ..models import PREFILL_STEP, prefill
from ..options import KVOptions
from ..tree import DraftTree
from ..verify import adapter_for
from ..verify.guard import TURN, restored_on_error


class Round(Protocol):
    """One round's draft, as the round loop and the commit read it."""

    tree: DraftTree  # tokens and topology (reading it may wait for the device)
    topology: DraftTree  # the topology alone: what the verify forward is built on
    device_tokens: Optional[mx.array]  # every node's token, maybe lazy; None: tree.tokens
    fed: List[int]  # tree node -> fed-tree node, -1 when the draft never saw it
    offset: int  # draft cache length before the round
    fed_tree: DraftTree  # what the draft cache holds past ``offset``, in order
    logprobs: dict  # tree node -> cumulative draft log-probability (confidence tree)
    forwards: int  # draft forwards this round ran


@dataclass
class DraftRound:
    """A round drafted on the host: every token known."""

    tree: DraftTree
    fed: List[int]
    offset: int
    fed_tree: DraftTree
    logprobs: dict = field(default_factory=dict)
    forwards: int = 0
    device_tokens = None

    @property
    def topology(self) -> DraftTree:
        return self.tree


class DeviceRound:
    """A round whose draft tokens may still be computing on the device.

    The drafter knew the topology (``topology``: a DraftTree of placeholder
    tokens, validated once per shape) and which nodes it fed (``fed``) before
    any token value: a chain, or a fixed shape whose children are the
    draft's top-k. ``device_tokens`` (all nodes, lazy) is what the round loop
    builds the target's verify on, so drafting and verifying are evaluated as
    one graph (mlx-lm's structure for chains): the host neither waits for the
    drafts nor leaves the device idle while it builds the verify graph.
    ``tree`` reads the tokens (waiting for them) on first use."""

    def __init__(self, root: int, topology: DraftTree, drafts: Optional[mx.array],
                 fed: List[int], offset: int, forwards: int):
        self.root, self.topology, self.offset = root, topology, offset
        self.fed, self.forwards, self.logprobs = fed, forwards, {}
        self._drafts, self._tree = drafts, None
        # The topology's tokens are placeholders: the verify always takes these.
        self.device_tokens = (
            mx.array([root], dtype=mx.uint32) if drafts is None
            else mx.concatenate([mx.array([root], dtype=drafts.dtype), drafts])
        )

    @property
    def parents(self) -> tuple:
        return self.topology.parents

    @property
    def tree(self) -> DraftTree:
        if self._tree is None:
            drafts = [] if self._drafts is None else self._drafts.tolist()
            self._tree = self.topology.with_tokens([self.root] + drafts)
        return self._tree

    @property
    def fed_tree(self) -> DraftTree:
        """What the draft cache holds past ``offset``: the fed nodes, in the
        order they were fed (the root alone when nothing was)."""
        return fed_tree_of(self.tree, self.fed)


def fed_tree_of(tree: DraftTree, fed: Sequence[int]) -> DraftTree:
    """The fed nodes of ``tree`` (``fed[i]``: node i's fed index, -1 if never
    fed), in the order they were fed."""
    order = sorted((f, i) for i, f in enumerate(fed) if f >= 0)
    if not order:
        return DraftTree([tree.tokens[0]], [-1])
    tokens, parents = tree.tokens, tree.parents
    return DraftTree([tokens[i] for _, i in order],
                     [-1 if i == 0 else fed[parents[i]] for _, i in order])


def logprobs_of(logits: mx.array) -> mx.array:
    """The draft's float32 log-probabilities, rows over the last axis: what
    every drafter ranks children by."""
    lp = logits.astype(mx.float32)
    return lp - mx.logsumexp(lp, axis=-1, keepdims=True)


def top_children(logits: mx.array, k: int) -> tuple:
    """Per row, the draft's ``k`` best children, best first, and their
    float32 log-probabilities: ``(ids, logprobs)``, both lazy (a caller
    that never reads the log-probabilities never computes them).

    Children are ranked by the logits in float32 (``top_ids``), not by the
    log-softmax: the cast is exact and keeps the order, so the ranking is
    the draft distribution's own and k = 1 is the chain's argmax, while
    subtracting the log-sum-exp can round values a few ulps apart together
    (a tie the log-softmax would give to the lower id) and costs two more
    passes over the vocabulary per row. The log-probabilities at the chosen
    ids are those of ``logprobs_of`` bit for bit (the same subtraction of
    the same float32 operands)."""
    x = logits.astype(mx.float32)
    ids = top_ids(x, k)
    return ids, mx.take_along_axis(x, ids, axis=-1) - mx.logsumexp(x, axis=-1, keepdims=True)


# Up to this k, ``top_ids`` takes k argmax passes; above it, a partition.
ARGMAX_PASSES = 4


def top_ids(logprobs: mx.array, k: int) -> mx.array:
    """Per row, the ids of the ``k`` largest values, largest first, equal
    values by lower id (numpy's stable argsort of the negated row): every tree drafter's children.
    Small k (every branching a drafter uses) as k argmax reductions, each after masking the ids
    already taken: cheaper than partitioning the vocabulary
    (docs/drafting.md#what-a-tree-round-costs). The -inf of a masked-out vocabulary entry is first
    raised to the dtype's lowest finite value, so that a taken id, masked to -inf, never wins
    again: k distinct ids while k fits the row. Larger k: a partition, then a sort of the k (a full
    argsort of a large vocabulary per level is far slower)."""
    k = min(k, logprobs.shape[-1])
    if k <= ARGMAX_PASSES:
        ids = [mx.argmax(logprobs, axis=-1, keepdims=True)]
        if k > 1:
            rest = mx.maximum(logprobs, mx.array(mx.finfo(logprobs.dtype).min, logprobs.dtype))
            taken = mx.array(-mx.inf, logprobs.dtype)
            for _ in range(k - 1):
                rest = mx.put_along_axis(rest, ids[-1], taken, axis=-1)
                ids.append(mx.argmax(rest, axis=-1, keepdims=True))
        return mx.concatenate(ids, axis=-1) if k > 1 else ids[0]
    ids = mx.argpartition(-logprobs, k - 1, axis=-1)[:, :k]
    values = mx.take_along_axis(logprobs, ids, axis=-1)
    return mx.take_along_axis(ids, mx.argsort(-values, axis=-1), axis=-1)


class Drafter:
    """The shared machinery; subclasses decide which nodes to expand
    (``_grow``) or draft a whole round themselves (``draft``)."""

    kind = "base"
    # Whether it drafts from the target's hidden states (treespec.draft.head):
    # then its model is a head, not a model of the target's vocabulary.
    reads_hidden = False

    def __init__(self):
        self.model = None
        self.cache = None
        self.pending: List[int] = []

    def start(self, model, prompt_without_root: Sequence[int],
              prefill_step_size: int = PREFILL_STEP, adapter=None,
              kv: KVOptions = kv_caches.DEFAULT):
        """Take ``model`` and prefill its cache. ``adapter``: the tree
        adapter for the draft model (default ``adapter_for(model)``, chains only
        for a chain drafter);
        ``kv``: mlx-lm's KV cache options, the target's (treespec.kv_options)."""
        self.model = model
        self.adapter = (adapter if adapter is not None
                        else adapter_for(model, chains=self.kind == "chain"))
        self.cache = kv_caches.make_cache(model, kv)
        self._quantize = kv_caches.quantizer(kv)
        # Grown level by level only where both the caches and the adapter
        # (treespec.verify: not through re-indexed per-position values) allow it.
        self.compacting = (caches.grows_in_parts(self.cache)
                           and getattr(self.adapter, "feeds_in_parts", True))
        self.pending = []
        self._step = prefill_step_size
        self._feed(prompt_without_root)

    def _feed(self, tokens: Sequence[int]):
        prefill(self.model, self.cache, tokens, self._step, after=self._quantize)

    def _save(self):
        return None if self.compacting else [caches.mode_of(c).save(c) for c in self.cache]

    def _restore(self):
        for c, s in zip(self.cache, self._saved):
            caches.mode_of(c).restore(c, s)

    def _offset(self) -> Optional[int]:
        """The draft cache's length, which only a compacting commit needs
        (a purely recurrent draft model has none)."""
        off = caches.offset(self.cache)
        if off is None and self.compacting:
            raise ValueError("the draft model's cache has no positional entry to read an offset from")
        return off

    # -- one round -------------------------------------------------------
    def draft(self, root: int, limit: Optional[int] = None) -> Round:
        """Grow this round's tree below ``root``. ``limit`` caps the number
        of draft nodes (the round loop shrinks it near max_tokens)."""
        self._lead = self._start_round()
        self._fed_tree = DraftTree([root], [-1])
        self._logits, self._top, self._forwards = {}, {}, 0
        self._expand([0])  # the root's distribution
        return self._grow(root, limit)

    def _start_round(self) -> List[int]:
        """Take the pending tokens; return those to feed in front of the
        root. A growing cache takes them in the root's forward (one forward,
        as mlx-lm feeds an accepted last draft with the next token); a cache
        that must be put back to the round's start is fed them first, then
        saved. Sets ``_round_offset``, where the root's row lands."""
        pending, self.pending = self.pending, []
        if self.compacting:
            self._round_offset, self._saved = self._offset() + len(pending), None
            return pending
        self._feed(pending)
        self._round_offset = self._offset()
        self._saved = self._save()
        return []

    def _expand(self, fed_nodes: List[int]):
        """Run the draft model over the newest fed-tree nodes; their
        ancestors are already in the cache (or are re-fed with them)."""
        start = fed_nodes[0]
        assert fed_nodes == list(range(start, len(self._fed_tree)))
        tree = self._fed_tree
        self._forwards += 1
        if tree.is_linear():
            # A chain is a plain forward: exactly mlx-lm's draft step.
            lead = self._lead if start == 0 else []
            tokens = mx.array(lead + list(tree.tokens[start:]))
            logits = self.model(tokens[None], cache=self.cache)[0, len(lead):]
        elif self.compacting:
            logits = self.adapter.verify(tree, self.cache, start=start)
        else:
            # Sliding-window and recurrent caches take a tree in one piece:
            # back to the round's start, then the whole fed tree again.
            self._restore()
            logits = self.adapter.verify(tree, self.cache)[start:]
        logprobs = logprobs_of(logits)
        k = self._top_needed()
        if k:
            # Every new node's top-k in one graph and one transfer: one sync
            # per level, not one per node.
            # Ranked by top_children; the values read off the log-softmax
            # already computed (the same numbers, one log-sum-exp per row).
            order = top_children(logits, k)[0]
            top = mx.take_along_axis(logprobs, order, axis=-1)
            mx.eval(logprobs, order, top)
            for row, pairs in enumerate(zip(order.tolist(), top.tolist())):
                self._top[fed_nodes[row]] = list(zip(*pairs))
        else:
            mx.eval(logprobs)
        for row, node in enumerate(fed_nodes):
            self._logits[node] = logprobs[row]

    def inject_level(self, part: DraftTree, start: int, tokens: mx.array,
                     owners: list) -> mx.array:
        """The logits of the fed tree's nodes ``start..`` (``tokens``, maybe
        lazy), fed on a growing cache that holds nodes ``0..start-1``: one
        forward through the adapter's tree injection (masks, per-node
        positions), what ``adapter.verify(part, cache, start=start)`` runs
        on such a cache, without the bookkeeping a drafter never reads
        (the snapshot for the adapter's commit: a draft commit is a trim).
        ``owners``: what ``adapter.check`` returned for this round's caches,
        checked once per round (nothing else writes them between levels)."""
        with self.level_turn(), self.adapter.injection(self.cache, part, owners, start) as probe:
            logits = self.model(tokens[None], cache=self.cache).squeeze(0)
            probe()
        return logits

    @contextmanager
    def level_turn(self):
        """What a tree verify holds (treespec.verify.guard), held by a
        drafting level that injects without ``adapter.verify``: the
        process's turn (another verify of this model would meet the swapped
        ropes) and the draft caches, put back if the forward raises."""
        with TURN, restored_on_error(self.cache):
            yield

    def _top_needed(self) -> int:
        """How many top children per expanded node to fetch with its
        logprobs (0: the subclass reads ``_logits`` itself)."""
        return 0

    def _grow(self, root, limit) -> DraftRound:
        raise NotImplementedError

    def commit(self, rnd: Round, path: Sequence[int]):
        """Keep the accepted path in the draft cache; queue what it missed.

        Growing caches keep the rows of the path's longest prefix of the fed
        order (rows ``offset ..`` hold the fed nodes in fed order, so that
        prefix already sits where a forward over the path would have written
        it): the commit is a trim, whatever the tree. The accepted nodes past
        it (a branch, or a level fed after a sibling's subtree, or never fed)
        are committed text the draft must see: they go in with the next root,
        in the forward every round starts with."""
        tokens, parents = rnd.tree.tokens, rnd.tree.parents
        if not path or path[0] != 0 or any(
                not 0 < b < len(parents) or parents[b] != a for a, b in zip(path, path[1:])):
            raise ValueError(f"path {list(path)} is not a root path of the round's tree "
                             f"(parents {list(parents)})")
        if not self.compacting:
            self._restore()
            self.pending = [tokens[n] for n in path]
            return
        fed, kept = rnd.fed, 0
        for node in path:
            if fed[node] != kept:
                break
            kept += 1
        for c in self.cache:
            # Appending caches (the only ones that grow in parts): the kept
            # prefix already sits in its rows; mlx-lm's trim (caches.kv).
            caches.mode_of(c).trim(c, rnd.offset + kept)
        self.pending = [tokens[n] for n in path[kept:]]
        self._quantize(self.cache)  # where mlx-lm's draft steps quantize, between rounds

    def watching(self, target):
        """The context the round loop runs the target's prefill and every
        verify in: nothing for a draft model; a head drafter records the
        target's hidden states there (treespec.draft.head)."""
        return nullcontext()

    def describe(self) -> dict:
        return {"kind": self.kind}

    def budget(self) -> int:
        raise NotImplementedError

    def probe_shapes(self, limit: Optional[int] = None) -> list:
        """The shapes this drafter's rounds can verify, with at most
        ``limit`` draft nodes (what ``max_tokens`` allows) when given."""
        raise NotImplementedError
