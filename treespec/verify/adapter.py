"""Target adapters: verify a whole draft tree in one forward of an mlx-lm model.

``adapter_for(model)`` (treespec.verify.for_model) accepts a model by its structure, not its name
(treespec.verify.structure: known cache modes, ropes that take per-node
offsets, no position arithmetic a tree verify cannot reach, recurrent mixers
that receive their cache on their own) and returns a :class:`TreeAdapter`;
anything else is refused with the specific reason. Whether the suite has
an audit record for the model's class is said, not required
(``adapter.family.record``; treespec.verify.audited).

``adapter.verify(tree, cache)`` runs ``model(tokens[None], cache=cache)`` once
over the flattened tree with the tree mask and ``offset + depth`` positions
injected (treespec.verify.attention; per-position values re-indexed by
depth, treespec.verify.positions; recurrent mixers run per depth,
treespec.verify.tree_recurrence) and returns one row of logits per node: each row
equals, bit for bit on the CPU reference BLAS, the last row of a plain
forward over that node's root path from the same cache state (where mlx-lm's
own one-token and multi-token paths differ, docs/families.md#the-table says which
one). The caches then hold all n nodes; ``commit`` rolls them back to the
accepted path through treespec.rollback (verify keeps what it needs: a
snapshot of the cache references and, on hybrid models, the recurrent
layers' inputs and per-node states).
"""

import itertools
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn

from .. import caches, rollback
from ..errors import RollbackRefused, TreeRefused
from ..mixers import Discovery, discover, slots
from ..models import model_type, vocab_size
from ..tree import DraftTree
from .attention import Sites, rope_owners, rope_refusal, tree_injected
from .guard import restored_on_error, taking_turns
from ..module_tree import ModuleTree
from .per_node import one_token_attentions
from .positions import position_inputs
from .strategy import RecurrentStrategy, recurrent_strategy
from .structure import Family, Structure

__all__ = ["Family", "TreeAdapter", "TreeRefused", "Verified"]


_SERIALS = itertools.count(1)  # one per verify, process-wide: handles of any adapter differ


@dataclass(frozen=True, eq=False)
class Verified:
    """One verify, as its commit takes it: returned by
    :meth:`TreeAdapter.verify_handle`, given to :meth:`TreeAdapter.commit`
    as ``verified=``. The adapter also keeps the latest one
    (:attr:`TreeAdapter.last_verified`, without its logits), which a
    commit without ``verified=`` takes.

    Invariant: a handle can be committed once, and only while it is the
    latest verify of its adapter and the caches still hold what that verify
    left (``marks``): anything else is refused with every cache untouched."""

    cache: Sequence  # the cache list the verify wrote into
    offset: Optional[int]  # the cache length before the verify
    topology: DraftTree  # the tree the rows were written by
    snapshot: rollback.Snapshot  # references to the pre-verify state
    captures: Optional[rollback.Captures]  # recurrent inputs and kept states
    written: Optional[dict] = None  # cache id -> what its one update wrote (rows.Written)
    marks: tuple = ()  # caches.marks(cache) right after the verify
    serial: int = 0  # which verify: unique in the process
    owner: int = 0  # id() of the adapter that verified
    # [n, vocab], row i for node i (only in the caller's handle: the
    # adapter's own copy holds none, so it keeps no logits buffer alive).
    logits: Optional[mx.array] = field(default=None, repr=False)


class _Census(NamedTuple):
    """What one pass of :meth:`TreeAdapter._checked` over a cache list found."""

    owners: list  # the rope owners checked (none without per-node positions)
    attention: list  # (cache, mode) of every attention cache, CacheList entries included
    offset: Optional[int]  # the attention caches' common offset (None: none)
    recurrent: bool  # whether some cache holds a recurrent state


def _at(where: tuple) -> str:
    return f"layer {where[0]}" + "".join(f", CacheList entry {j}" for j in where[1:])


class TreeAdapter:
    """Tree verify for one model. Holds no patch between calls."""

    def __init__(
        self,
        model: nn.Module,
        family: Family,
        recurrent: Optional[RecurrentStrategy] = None,
        found: Optional[Discovery] = None,
        walks: Optional[Structure] = None,
    ):
        self.model = model
        self.family = family
        self.model_type = model_type(model)
        if recurrent is None and family.recurrent is not None:
            recurrent = recurrent_strategy(family.recurrent)
        self.recurrent = recurrent
        if found is None:
            found = discover(model) if family.recurrent is not None else Discovery()
        # Where the recurrent mixers sit (their ropes are theirs to call, and
        # commit replays or records them there); shared with the strategy.
        self.found = found
        if hasattr(recurrent, "use"):
            recurrent.use(model, found)
        self._skip = frozenset(id(m.module) for m in found.mixers)
        # The modules receiving per-position values, found once (the ropes
        # are found again whenever the module tree changed: one may be
        # swapped after the adapter is made).
        # ``walks``: what structure() walked this model for (adapter_for's),
        # the same lists, not walked for again.
        walked = slots(model) if walks is None else walks.walked
        self._positions = [] if not family.positions else (
            position_inputs(model, walked) if walks is None else walks.positions)
        # Attentions whose one-token step is a code path of its own: every
        # verify of 2+ nodes, chains too, runs their nodes as one-token steps
        # (treespec.verify.per_node).
        self._one_token = one_token_attentions(model, walked)
        # The latest verify (its handle without logits), until it is
        # committed: what a commit without ``verified=`` takes.
        self._last: Optional[Verified] = None
        self._committed = 0  # the serial of the latest verify committed
        self._vocab: Optional[int] = None
        # The rope owners of the last walk, valid while the module tree is
        # the snapshot's (treespec.module_tree).
        self._owners: Optional[list] = None
        self._tree: Optional[ModuleTree] = None
        if walks is not None:  # the same rope attribute and skipped mixers
            self._tree, self._owners = ModuleTree(model), walks.owners
        # id(rope owner) -> its TreeRoPE, re-armed by every injection of this
        # adapter while the owners are those of the last walk.
        self._rope_pool: dict = {}

    @property
    def rope_pool(self) -> dict:
        """The rope stand-ins this adapter re-arms (id(rope owner) ->
        TreeRoPE), for an injection of the owners its last ``check``
        returned (a new dict whenever the module tree changed)."""
        return self._rope_pool

    def vocab(self) -> int:
        """The width of the model's logits: node tokens must be below it."""
        if self._vocab is None:
            self._vocab = vocab_size(self.model)
        return self._vocab

    def __repr__(self):
        rec = f", recurrent={self.recurrent.name!r}" if self.recurrent else ""
        return f"TreeAdapter({self.model_type!r}{rec}; {self.family.record})"

    @property
    def feeds_in_parts(self) -> bool:
        """Whether ``verify`` may continue a tree from ``start`` > 0 on this
        model's attention caches: not where per-position values are
        re-indexed by depth (treespec.verify.positions), whose continued
        parts lack their earlier depths."""
        return not self.family.positions

    @property
    def note(self) -> Optional[str]:
        """A line for a decode's diagnostics when the model has no audit
        record (treespec.verify.audited), else None."""
        record = self.family.record
        return None if record.startswith("audited") else f"{self.model_type}: {record}"

    def _refuse(self, reason: str):
        raise TreeRefused(self.model_type, reason)

    @taking_turns
    def check_model(self) -> list:
        """Raise TreeRefused if some attention's RoPE cannot take per-node
        positions (also run by adapter_for, and again by every check: a rope
        may be swapped after the adapter was made; the owners are walked for
        again only when the module tree changed). Returns the rope owners
        (none for an attention without rope: no position to give it)."""
        attr = self.family.rope_attr
        if self._owners is None or self._tree.changed():
            self._tree = ModuleTree(self.model)
            self._owners = rope_owners(self.model, attr, self._skip)
            self._rope_pool = {}
        owners = self._owners
        for name, owner in owners:
            why = rope_refusal(owner[attr])
            if why:
                self._refuse(f"{name}.{attr}: {why}")
        return owners

    def check(self, tree: DraftTree, cache: Sequence, start: int = 0,
              ropes: bool = True) -> list:
        """Raise TreeRefused if this cache state cannot verify this tree (its
        nodes ``start..``, see :meth:`verify`). Reads only: nothing is
        written. Returns the rope owners it checked (none when ``ropes`` is
        False: a plain forward, which gives no per-node positions)."""
        return self._checked(tree, cache, start, ropes).owners

    def _checked(self, tree: DraftTree, cache: Sequence, start: int, ropes: bool) -> "_Census":
        """:meth:`check`, returning what its one pass over the caches found
        (the verify reads it instead of walking the caches again)."""
        if not isinstance(tree, DraftTree):
            raise TypeError(f"expected a DraftTree, got {type(tree).__name__}")
        if not (isinstance(start, int) and 0 <= start < len(tree)):
            raise ValueError(f"start must be a node of the tree (0..{len(tree) - 1}), got {start!r}")
        attention, recurrent = [], []  # (cache, its mode)
        for where, c in caches.leaves(cache):
            mode = caches.mode_of(c)
            if mode.attention:
                why = mode.verify_refusal(c)
                if why:
                    self._refuse(f"{_at(where)}: {why}")
                attention.append((c, mode))
            elif mode.recurrent and self.recurrent is not None:
                recurrent.append((c, mode))
            else:
                what = ("this adapter has no recurrent strategy" if mode.recurrent
                        else "no tree mask or exact rollback is known for it")
                self._refuse(f"{_at(where)}: cache {type(c).__name__} cannot verify a tree "
                             f"({what})")
        # A cache no forward ever wrote belongs to a layer that never attends.
        written = [c for c, mode in attention if mode.written(c)]
        offsets = sorted({c.offset for c in written or [c for c, _ in attention]})
        if len(offsets) > 1:
            self._refuse(f"attention caches disagree on their offset: {offsets}")
        if start:
            if offsets and offsets[0] < start:
                self._refuse(f"start {start} but the caches hold only {offsets[0]} tokens")
            whole = [c for c, mode in attention if mode.whole_trees_only]
            if whole:
                # A second update of a ring re-trims it by flattened order (a
                # needed ancestor can fall out), and rollback cannot commit
                # tree rows written by several updates.
                self._refuse(
                    f"{type(whole[0]).__name__}: a tree fed in parts (start={start}) is "
                    "written by several updates; feed it whole"
                )
            if recurrent:
                # Its commit restores the pre-verify state and replays (or
                # copies) what one forward saw: a part's forward alone is not
                # the tree.
                self._refuse(f"{self.recurrent.name} cannot continue a tree from start={start}: "
                             "recurrent layers take a tree in one forward")
            if self.family.positions and ropes:
                # The re-indexed values are those of the fed positions only
                # (treespec.verify.positions): earlier depths are not among them.
                self._refuse(f"a tree fed in parts (start={start}) through per-position "
                             "values the model computes itself; feed it whole")
        owners = self.check_model() if ropes else []
        for c, mode in recurrent:
            why = mode.verify_refusal(c)
            if why:
                self._refuse(why)
        if recurrent:
            why = self.recurrent.refusal(self.model, cache, tree)
            if why:
                self._refuse(why)
        return _Census(owners, attention, offsets[0] if offsets else None, bool(recurrent))

    def verify(self, tree: DraftTree, cache: Sequence, start: int = 0,
               tokens: Optional[mx.array] = None, inject: Optional[bool] = None) -> mx.array:
        """The logits of :meth:`verify_handle` (same arguments): commit the
        accepted path with ``commit(cache, tree, path)``, which takes this
        verify's handle from :attr:`last_verified`."""
        return self.verify_handle(tree, cache, start, tokens, inject).logits

    @taking_turns
    def verify_handle(self, tree: DraftTree, cache: Sequence, start: int = 0,
                      tokens: Optional[mx.array] = None,
                      inject: Optional[bool] = None) -> Verified:
        """One forward over the tree: its :class:`Verified`, whose ``logits``
        [n, vocab] hold row i for node i.

        The caches end holding all n nodes (in flattened order); commit the
        accepted path with ``commit(cache, tree, path, verified=handle)``.
        ``start`` > 0 continues a tree
        whose nodes ``0..start-1`` a previous verify of it (with its own
        ``start``) already wrote: only nodes ``start..`` are fed, and their
        n - start rows returned (a drafter growing its tree level by level).
        ``tokens``: the fed nodes' tokens as a device array, possibly not yet
        computed (a chain still being drafted); the forward is built on them
        and ``tree`` gives only the topology. Their values are not read
        (that would wait for the device): they must be ids of this model's
        vocabulary, as a drafter's top-k over logits of its width are.
        ``inject=True`` sends a chain through the tree path too (mask array,
        per-node RoPE, tree-aware recurrence) instead of a plain forward:
        correct by construction, so treespec.evidence.numerics measures the tree
        path's own kernels with it.

        Takes its turn (treespec.verify.guard: one verify at a time in the
        process). Refusals come before anything is written; if the forward
        raises, every cache is put back as it was.
        """
        if not isinstance(tree, DraftTree):
            raise TypeError(f"tree must be a DraftTree, got {type(tree).__name__}")
        if tokens is None:
            vocab = self.vocab()
            if max(tree.tokens[start:], default=0) >= vocab:
                node = next(i for i, t in enumerate(tree.tokens) if i >= start and t >= vocab)
                raise ValueError(f"tree node {node}: token id {tree.tokens[node]} is outside "
                                 f"the vocabulary [0, {vocab}) of this {self.model_type!r} model")
        elif not isinstance(tokens, mx.array) or not mx.issubdtype(tokens.dtype, mx.integer):
            what = tokens.dtype if isinstance(tokens, mx.array) else type(tokens).__name__
            raise TypeError(f"tokens must be an mx.array of integer token ids, got {what}")
        # A chain is mlx-lm's own chain verify: a plain forward, whose causal
        # mask and contiguous positions are the tree's (contracts 1 and 5),
        # through the kernels mlx-lm's speculative decoding uses, and cheaper
        # than injecting them; continued (``start`` > 0) too, as a drafter
        # growing a spine feeds it. A one-node tree is a plain decode step,
        # left alone so that a wrapped RotatingKVCache takes the same in-place
        # update (and key order) as classic decoding.
        if inject is None:
            # mlx-lm's chain verify is not classic decoding where the one-token
            # step takes its own path: chains go through the tree path there
            inject = not tree.is_linear() or bool(self._one_token)
        inject = bool(inject) and len(tree) > 1
        # Only an injected forward needs every rope to take per-node
        # positions, so only it walks the modules for them.
        census = self._checked(tree, cache, start, inject)
        owners = census.owners
        # Caches a verify of 2+ nodes writes in a layout of its own (a
        # sliding-window ring laid out as classic one-token steps see it),
        # chains included.
        plans = self._plans(census.attention, tree) if len(tree) > 1 else {}
        offset = None if census.offset is None else census.offset - start
        snap = rollback.snapshot(cache)  # references only
        has_recurrent = census.recurrent
        captures = None
        if tokens is None:
            tokens = mx.array(tree.tokens[start:], dtype=mx.int32)
        elif tuple(tokens.shape) != (len(tree) - start,):
            raise ValueError(f"tokens has shape {tuple(tokens.shape)}, the tree feeds "
                             f"{len(tree) - start} nodes")
        tokens = tokens[None]
        with ExitStack() as stack:
            stack.enter_context(restored_on_error(cache))  # outermost: exits last
            if inject and self.recurrent is not None:
                stack.enter_context(self.recurrent.inject(self.model, cache, tree))
            if inject or plans:
                probe = stack.enter_context(
                    self.injection(cache, tree, owners, start, plans=plans, ropes=inject))
            updates = None
            if inject and start == 0 and not tree.is_linear():
                # A branch's commit reads its rows from what this forward
                # wrote, not from the caches' buffers: no evaluation first.
                updates = stack.enter_context(rollback.capture_written(cache))
            if has_recurrent:
                # Innermost, so it records whatever mixer the strategy put in;
                # commit replays the path's rows through the real one.
                captures = stack.enter_context(
                    rollback.capture_recurrent_inputs(self.model, self.found.mixers))
            try:
                logits = self.model(tokens, cache=cache)
            except TreeRefused as e:
                if e.family is not None:
                    raise
                raise TreeRefused(self.model_type, e.reason) from None  # a cache's, by name
            if inject or plans:
                probe()
        if inject and captures is not None:
            # The tree-aware recurrence kept every node's state: commit copies
            # the accepted one instead of replaying the path.
            for entry, states in self.recurrent.kept_states():
                captures.keep(entry, states)
        written = rollback.single_updates(updates) if updates else None
        self._last = Verified(cache, offset, tree, snap, captures, written,
                              caches.marks(cache), next(_SERIALS), id(self))
        # squeeze: a view, where logits[0] would gather the row
        return replace(self._last, logits=logits.squeeze(0))

    def _plans(self, attention: Sequence, tree: DraftTree) -> dict:
        """cache id -> its mode's verify plan (treespec.caches), for the
        attention caches (``(cache, mode)``, as :meth:`_checked` found them)
        that have one. A model builds one mask per kind of layer from one
        cache, so every plan must lay out the same keys."""
        plans = {}
        for c, mode in attention:
            plan = mode.verify_plan(c, tree)
            if plan is not None:
                plans[id(c)] = plan
        keys = {p.key() for p in plans.values()}
        if len(keys) > 1:
            self._refuse(f"its sliding-window caches are in {len(keys)} different ring states "
                         "(size, kept slots, offset or write slot differ); one mask cannot "
                         "serve them all")
        return plans

    def injection(self, cache: Sequence, tree: DraftTree, owners: list, start: int,
                  plans: Optional[dict] = None, ropes: bool = True):
        """The context manager that gives one forward the tree's masks (the
        ring layout's where a cache has a plan) and, with ``ropes``, per-node
        positions (treespec.verify.attention.tree_injected); it yields a
        probe that raises if the forward bypassed them. A subclass may inject
        something else (the suites plant defects here)."""
        sites = Sites(self.family.rope_attr, owners, self._positions,
                      self._one_token if ropes else (), self.rope_pool)
        return tree_injected(self.model, cache, tree, sites, start, plans=plans, ropes=ropes)

    @property
    def last_verified(self) -> Optional[Verified]:
        """The latest verify's handle (without logits) until it is committed;
        None before any verify and after its commit."""
        return self._last

    @taking_turns
    def commit(
        self,
        cache: Sequence,
        tree: DraftTree,
        path: Sequence[int],
        offset: Optional[int] = None,
        *,
        verified: Optional[Verified] = None,
    ) -> int:
        """Roll the caches back to the accepted root ``path`` of the ``tree``
        verified by ``verified`` (a :meth:`verify_handle`; default
        :attr:`last_verified`, the latest :meth:`verify` of this adapter):
        attention rows compacted, recurrent states replayed along the path
        (``treespec.rollback.commit_path``, with the snapshot and recurrent
        inputs the verify recorded). ``cache`` and ``tree`` must be the
        verified cache list and a tree of its topology; ``offset``, if given,
        the cache length before that verify (a cross-check). Returns the
        committed length. Raises RollbackRefused, naming the argument at
        fault, with every cache untouched when that cannot be exact: a
        handle that is not this adapter's latest verify (another verify or
        its commit came since), caches written since the verify, or a path
        the caches cannot keep exactly."""
        v = self._committable(cache, tree, offset, verified)
        # The topology is what the rows were written by (a chain's verify may
        # have run before its tokens were known).
        committed = rollback.commit_path(
            cache, v.offset or 0, path, tree, snapshot=v.snapshot, recurrent=v.captures,
            written=v.written)
        self._last, self._committed = None, v.serial
        return committed

    def _committable(self, cache, tree, offset, verified) -> Verified:
        """The handle a commit of (``cache``, ``tree``) takes, checked to be
        the latest verify's, of these caches as that verify left them."""
        last = self._last
        if verified is None:
            if last is None:
                raise RollbackRefused("commit needs the cache list and tree of the last verify: "
                                      "no verify of this adapter is waiting for its commit")
            verified = last
        elif not isinstance(verified, Verified):
            raise TypeError(f"verified must be a Verified (from verify_handle), got "
                            f"{type(verified).__name__}")
        elif verified.owner != id(self):
            raise RollbackRefused("verified: the handle of another adapter's verify")
        elif last is None or verified.serial != last.serial:
            why = ("it was committed already" if verified.serial == self._committed
                   else "a later verify of this adapter came since")
            raise RollbackRefused(f"verified: a stale handle: {why}")
        if verified.cache is not cache:
            raise RollbackRefused("cache: commit needs the cache list and tree of the last "
                                  "verify; this is another cache list")
        if not isinstance(tree, DraftTree) or verified.topology.parents != tree.parents:
            raise RollbackRefused("tree: commit needs the cache list and tree of the last verify; "
                                  "its parents are not the verified topology's "
                                  f"{list(verified.topology.parents)}")
        if offset is not None and offset != verified.offset:
            raise RollbackRefused(f"offset: {offset} is not the {verified.offset} the verify "
                                  "started at")
        if caches.marks(cache) != verified.marks:
            raise RollbackRefused("cache: the caches were written since the verify (an offset, "
                                  "a ring slot or an array is not the one it left)")
        return verified
