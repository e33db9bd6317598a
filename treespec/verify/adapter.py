"""Target adapters: verify a whole draft tree in one forward of an mlx-lm model.

``adapter_for(model)`` looks the model's ``model_type`` up in :data:`FAMILIES`
(families whose attention takes its mask from ``cache.make_mask`` and its
positions from ``self.rope(x, offset=...)``, audited by suites/verify) and
returns a :class:`TreeAdapter`; anything else is refused by name.

``adapter.verify(tree, cache)`` runs ``model(tokens[None], cache=cache)`` once
over the flattened tree with the tree mask and ``offset + depth`` positions
injected (treespec.verify.attention) and returns one row of logits per node:
each row equals, bit for bit on the CPU reference BLAS, the last row of a
plain forward over that node's root path from the same cache state. The
caches then hold all n nodes; ``commit`` rolls them back to the accepted path
through treespec.rollback (verify keeps what it needs: a snapshot of the
cache references and, on hybrid models, the recurrent layers' inputs).
"""

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Optional, Sequence

import mlx.core as mx
import mlx.nn as nn

from .. import caches, rollback
from ..errors import TreeRefused
from ..models import model_type
from ..tree import DraftTree
from .attention import rope_owners, rope_refusal, tree_injected
from .recurrent import RecurrentStrategy, recurrent_strategy

__all__ = ["FAMILIES", "Family", "TreeAdapter", "TreeRefused", "adapter_for"]


@dataclass(frozen=True)
class Family:
    """What the adapter needs to know about an mlx-lm model family."""

    # Kind of recurrent layer (a key of treespec.verify.recurrent's registry),
    # None for attention-only families (which then refuse recurrent caches).
    recurrent: Optional[str] = None
    # Attribute of the attention modules holding the RoPE.
    rope_attr: str = "rope"


_ATTENTION = Family()
_GATED_DELTA = Family(recurrent="gated_delta")

# Audited families. Zoo families are exercised by suites/verify on several
# dtypes; the others share the attention/rope/mask pattern (mistral is
# llama's module) and pass the same root-path check with tiny random
# models (suites/verify/test_other_families.py). Add a family here only
# with such a test.
FAMILIES = {
    "llama": _ATTENTION,
    "qwen3": _ATTENTION,
    "gemma3_text": _ATTENTION,
    "gemma4_text": _ATTENTION,
    "qwen3_5": _GATED_DELTA,
    "qwen3_next": _GATED_DELTA,
    # same pattern, checked with tiny random models
    "mistral": _ATTENTION,
    "qwen2": _ATTENTION,
    "phi3": _ATTENTION,
    "olmo2": _ATTENTION,
    "granite": _ATTENTION,
    "starcoder2": _ATTENTION,
    "smollm3": _ATTENTION,  # NoPE layers
    "cohere2": _ATTENTION,  # sliding layers on RotatingKVCache; global layers call no rope
}


@dataclass(frozen=True)
class _Verified:
    """What the last verify of a cache list leaves for its commit."""

    cache: Sequence
    offset: Optional[int]  # the cache length before the verify
    topology: DraftTree  # the tree the rows were written by
    snapshot: rollback.Snapshot  # references to the pre-verify state
    captures: Optional[rollback.Captures]  # recurrent inputs and kept states


class TreeAdapter:
    """Tree verify for one model. Holds no patch between calls."""

    def __init__(
        self,
        model: nn.Module,
        family: Family,
        recurrent: Optional[RecurrentStrategy] = None,
    ):
        self.model = model
        self.family = family
        self.model_type = model_type(model)
        if recurrent is None and family.recurrent is not None:
            recurrent = recurrent_strategy(family.recurrent)
        self.recurrent = recurrent
        self._last: Optional[_Verified] = None

    def __repr__(self):
        rec = f", recurrent={self.recurrent.name!r}" if self.recurrent else ""
        return f"TreeAdapter({self.model_type!r}{rec})"

    def _refuse(self, reason: str):
        raise TreeRefused(self.model_type, reason)

    def check_model(self) -> list:
        """Raise TreeRefused if some attention's RoPE cannot take per-node
        positions (also run by adapter_for, and again by every check: a rope
        may be swapped after the adapter was made). Returns the rope owners."""
        attr = self.family.rope_attr
        owners = rope_owners(self.model, attr)
        if not owners:
            self._refuse(f"no attention module has a {attr!r} to give per-node positions to")
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
        if not isinstance(tree, DraftTree):
            raise TypeError(f"expected a DraftTree, got {type(tree).__name__}")
        if not (isinstance(start, int) and 0 <= start < len(tree)):
            raise ValueError(f"start must be a node of the tree (0..{len(tree) - 1}), got {start!r}")
        attention, recurrent = [], []
        for i, c in enumerate(cache):
            mode = caches.mode_of(c)
            if mode.attention:
                why = mode.verify_refusal(c)
                if why:
                    self._refuse(f"layer {i}: {why}")
                attention.append(c)
            elif mode.recurrent and self.recurrent is not None:
                recurrent.append(c)
            else:
                self._refuse(
                    f"layer {i}: cache {type(c).__name__} is neither an attention "
                    "cache a tree mask can replace nor this family's recurrent cache"
                )
        offsets = sorted({c.offset for c in attention})
        if len(offsets) > 1:
            self._refuse(f"attention caches disagree on their offset: {offsets}")
        if start:
            if offsets and offsets[0] < start:
                self._refuse(f"start {start} but the caches hold only {offsets[0]} tokens")
            whole = [c for c in attention if caches.mode_of(c).whole_trees_only]
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
        owners = self.check_model() if ropes else []
        for c in recurrent:
            why = caches.mode_of(c).verify_refusal(c)
            if why:
                self._refuse(why)
        if recurrent:
            why = self.recurrent.refusal(self.model, cache, tree)
            if why:
                self._refuse(why)
        return owners

    def verify(self, tree: DraftTree, cache: Sequence, start: int = 0,
               tokens: Optional[mx.array] = None, inject: Optional[bool] = None) -> mx.array:
        """Logits [n, vocab], row i for node i, from one forward over the tree.

        The caches end holding all n nodes (in flattened order); commit the
        accepted path with :meth:`commit`. ``start`` > 0 continues a tree
        whose nodes ``0..start-1`` a previous verify of it (with its own
        ``start``) already wrote: only nodes ``start..`` are fed, and their
        n - start rows returned (a drafter growing its tree level by level).
        ``tokens``: the fed nodes' tokens as a device array, possibly not yet
        computed (a chain still being drafted); the forward is built on them
        and ``tree`` gives only the topology. ``inject=True`` sends a chain
        through the tree path too (mask array, per-node RoPE, tree-aware
        recurrence) instead of a plain forward: correct by construction, so
        treespec.numerics measures the tree path's own kernels with it.
        """
        # A chain is mlx-lm's own chain verify: a plain forward, whose causal
        # mask and contiguous positions are the tree's (contracts 1 and 5),
        # through the kernels mlx-lm's speculative decoding uses, and cheaper
        # than injecting them; continued (``start`` > 0) too, as a drafter
        # growing a spine feeds it. A one-node tree is a plain decode step,
        # left alone so that a wrapped RotatingKVCache takes the same in-place
        # update (and key order) as classic decoding.
        if inject is None:
            inject = not tree.is_linear()
        inject = bool(inject) and len(tree) > 1
        # Only an injected forward needs every rope to take per-node
        # positions, so only it walks the modules for them.
        owners = self.check(tree, cache, start, ropes=inject)
        offset = caches.offset(caches.attention_caches(cache))
        offset = None if offset is None else offset - start
        snap = rollback.snapshot(cache)  # references only
        has_recurrent = any(caches.mode_of(c).recurrent for c in cache)
        captures = None
        if tokens is None:
            tokens = mx.array(tree.tokens[start:], dtype=mx.int32)
        elif tuple(tokens.shape) != (len(tree) - start,):
            raise ValueError(f"tokens has shape {tuple(tokens.shape)}, the tree feeds "
                             f"{len(tree) - start} nodes")
        tokens = tokens[None]
        with ExitStack() as stack:
            if inject:
                if self.recurrent is not None:
                    stack.enter_context(self.recurrent.inject(self.model, cache, tree))
                probe = stack.enter_context(self.injection(cache, tree, owners, start))
            if has_recurrent:
                # Innermost, so it records whatever mixer the strategy put in;
                # commit replays the path's rows through the real one.
                captures = stack.enter_context(rollback.capture_recurrent_inputs(self.model))
            logits = self.model(tokens, cache=cache)
            if inject:
                probe()
        if inject and captures is not None:
            # The tree-aware recurrence kept every node's state: commit copies
            # the accepted one instead of replaying the path.
            for entry, states in self.recurrent.kept_states():
                captures.keep(entry, states)
        self._last = _Verified(cache, offset, tree, snap, captures)
        return logits[0]

    def injection(self, cache: Sequence, tree: DraftTree, owners: list, start: int):
        """The context manager that gives one forward the tree's mask and
        per-node positions (treespec.verify.attention.tree_injected); it
        yields a probe that raises if the forward bypassed either. A
        subclass may inject something else (the suites plant defects here)."""
        return tree_injected(self.model, cache, tree, self.family.rope_attr, owners, start)

    def commit(
        self,
        cache: Sequence,
        tree: DraftTree,
        path: Sequence[int],
        offset: Optional[int] = None,
    ) -> int:
        """Roll the caches back to the accepted root ``path`` of the ``tree``
        the last :meth:`verify` of this very cache list verified: attention
        rows compacted, recurrent states replayed along the path
        (``treespec.rollback.commit_path``, with the snapshot and recurrent
        inputs verify recorded). ``offset``, if given, must be the cache length
        before that verify (a cross-check). Returns the committed length.
        Raises RollbackRefused with every cache untouched when that cannot be
        exact."""
        # The topology is what the rows were written by (a chain's verify may
        # have run before its tokens were known).
        last = self._last
        if last is None or last.cache is not cache or last.topology.parents != tree.parents:
            raise ValueError("commit needs the cache list and tree of the last verify")
        if offset is not None and offset != last.offset:
            raise ValueError(f"offset {offset} is not the {last.offset} the verify started at")
        committed = rollback.commit_path(
            cache, last.offset or 0, path, tree, snapshot=last.snapshot, recurrent=last.captures
        )
        self._last = None
        return committed


def adapter_for(model: nn.Module, recurrent: Optional[RecurrentStrategy] = None) -> TreeAdapter:
    """The tree-verify adapter for ``model``'s family, or TreeRefused naming
    the family and why. ``recurrent`` overrides the family's recurrent
    strategy (see treespec.verify.recurrent.register_recurrent)."""
    mt = model_type(model)
    family = FAMILIES.get(mt)
    if family is None:
        raise TreeRefused(
            mt,
            "not an audited tree-verify family (its attention may not take masks "
            "from cache.make_mask and positions from self.rope); audited: "
            + ", ".join(sorted(FAMILIES)),
        )
    adapter = TreeAdapter(model, family, recurrent)
    adapter.check_model()
    return adapter
