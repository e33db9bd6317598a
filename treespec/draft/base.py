"""The drafters' shared machinery: a round's tree, the draft model's cache,
and committing the accepted path into it.

A drafter owns the draft model's cache. Between rounds that cache holds the
committed text except the root (the last committed token), exactly like the
target's. Drafting feeds the root and the nodes it expands into the cache;
``commit`` keeps only the accepted ones (the same ``commit_path`` the target
uses), and remembers accepted tokens the draft never fed so the next round
feeds them first.

Two ways to keep the draft cache on the accepted path, chosen by cache mode
(``treespec.caches``): caches of plain time-ordered rows (KVCache,
QuantizedKVCache) are grown in parts and compacted in place; any other cache
(sliding window, recurrent) is put back to the round's start and fed the
accepted tokens in one forward, one small draft forward per round.
"""

from dataclasses import dataclass, field
from typing import List, Optional, Protocol, Sequence

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from .. import caches
from ..models import PREFILL_STEP, prefill
from ..rollback import commit_path
from ..tree import DraftTree
from ..verify import adapter_for


class Round(Protocol):
    """One round's draft, as the round loop and the commit read it."""

    tree: DraftTree  # tokens and topology (reading it may wait for the device)
    topology: DraftTree  # the topology alone: what the verify forward is built on
    device_tokens: Optional[mx.array]  # every node's token, lazy; None: tree.tokens
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

    The drafter knew the topology (``parents``) and which nodes it fed
    (``fed``) before any token value: a chain, or a fixed shape whose children
    are the draft's top-k. ``device_tokens`` (all nodes, lazy) is what the
    round loop builds the target's verify on, so drafting and verifying are
    evaluated as one graph (mlx-lm's structure for chains): the host neither
    waits for the drafts nor leaves the device idle while it builds the
    verify graph. ``tree`` reads the tokens (waiting for them) on first use."""

    def __init__(self, root: int, parents: Sequence[int], drafts: Optional[mx.array],
                 fed: List[int], offset: int, forwards: int):
        self.root, self.parents, self.offset = root, list(parents), offset
        self.fed, self.forwards, self.logprobs = list(fed), forwards, {}
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


def logprobs_of(logits: mx.array) -> mx.array:
    """The draft's float32 log-probabilities, rows over the last axis: what
    every drafter ranks children by."""
    lp = logits.astype(mx.float32)
    return lp - mx.logsumexp(lp, axis=-1, keepdims=True)


def top_ids(logprobs: mx.array, k: int) -> mx.array:
    """Per row, the ids of the ``k`` largest values, largest first: every
    tree drafter's children. A partition, then a sort of the k: a full
    argsort of a large vocabulary per level is far slower."""
    k = min(k, logprobs.shape[-1])
    if k == 1:
        return mx.argmax(logprobs, axis=-1, keepdims=True)
    ids = mx.argpartition(-logprobs, k - 1, axis=-1)[:, :k]
    values = mx.take_along_axis(logprobs, ids, axis=-1)
    return mx.take_along_axis(ids, mx.argsort(-values, axis=-1), axis=-1)


class Drafter:
    """The shared machinery; subclasses decide which nodes to expand
    (``_grow``) or draft a whole round themselves (``draft``)."""

    kind = "base"

    def __init__(self):
        self.model = None
        self.cache = None
        self.pending: List[int] = []

    def start(self, model, prompt_without_root: Sequence[int],
              prefill_step_size: int = PREFILL_STEP, adapter=None):
        """Take ``model`` and prefill its cache. ``adapter``: the tree
        adapter for the draft model (default ``adapter_for(model)``)."""
        self.model = model
        self.adapter = adapter if adapter is not None else adapter_for(model)
        self.cache = make_prompt_cache(model)
        # Grown level by level only where both the caches and the adapter
        # (treespec.verify: not through re-indexed per-position values) allow it.
        self.compacting = (caches.grows_in_parts(self.cache)
                           and getattr(self.adapter, "feeds_in_parts", True))
        self.pending = []
        self._step = prefill_step_size
        self._feed(prompt_without_root)

    def _feed(self, tokens: Sequence[int]):
        prefill(self.model, self.cache, tokens, self._step)

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
        self._feed(self.pending)
        self.pending = []
        self._round_offset = self._offset()
        self._saved = self._save()
        self._fed_tree = DraftTree([root], [-1])
        self._logits, self._top, self._forwards = {}, {}, 0
        self._expand([0])  # the root's distribution
        return self._grow(root, limit)

    def _expand(self, fed_nodes: List[int]):
        """Run the draft model over the newest fed-tree nodes; their
        ancestors are already in the cache (or are re-fed with them)."""
        start = fed_nodes[0]
        assert fed_nodes == list(range(start, len(self._fed_tree)))
        tree = self._fed_tree
        self._forwards += 1
        if tree.is_linear():
            # A chain is a plain forward: exactly mlx-lm's draft step.
            logits = self.model(mx.array(tree.tokens[start:])[None], cache=self.cache)[0]
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

    def commit(self, rnd: Round, path: Sequence[int]):
        """Keep the accepted path in the draft cache; queue what it missed."""
        if not self.compacting:
            self._restore()
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

    def budget(self) -> int:
        raise NotImplementedError

    def probe_shapes(self) -> list:
        raise NotImplementedError
