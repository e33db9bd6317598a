"""The negative controls of a numeric verdict: the tree verified again with
one deliberate defect in what treespec injects (positions flattened to a
chain's, mlx-lm's plain causal mask, one sibling leaked into another's
view, the recurrence taking the tree unmodified), and how far each lands
from the correct rows. treespec.evidence.numerics measures the envelope a comparison
is judged within; the controls say whether a defect of the kind the check
exists for would land outside it (treespec.evidence.verdicts, the separation rule).
"""

import copy
from contextlib import contextmanager
from typing import Callable, Dict, Optional, Tuple

import mlx.core as mx
import numpy as np
from mlx_lm.models.base import create_causal_mask

from ..caches import mode_of
from ..errors import TreeRefused
from ..tree import DraftTree
from ..verify import TreeAdapter, adapter_for
from ..verify.attention import Sites, injected, tree_injected, tree_mask

__all__ = ["CONTROLS", "RECURRENCE", "SUBSTITUTED", "FlatRecurrence", "adapter_or_none", "clone",
           "control_rows", "controls", "leaked_node_verifier", "max_abs_diff", "verifiers"]

CONTROLS = ("flattened positions", "causal mask", "leaked sibling")
RECURRENCE = "flattened recurrence"  # a model with recurrent layers: the tree through them unmodified
SUBSTITUTED = "substituted token"  # a plain forward with one token replaced: a stale rollback row


def clone(cache) -> list:
    """A copy of mlx-lm caches with their arrays (deepcopy copies them)."""
    return copy.deepcopy(cache)


def max_abs_diff(a: mx.array, b: mx.array) -> float:
    """The largest |a - b| in float32; inf for different shapes, nan for a nan."""
    if a.shape != b.shape:
        return float("inf")
    d = mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item()
    return float("nan") if d != d else float(d)


def adapter_or_none(model):
    """treespec's adapter for ``model``, or None where it refuses the model."""
    try:
        return adapter_for(model)
    except TreeRefused:
        return None


class _Control(TreeAdapter):
    """treespec's adapter with one deliberate defect in what it injects."""

    defect = ""

    def injection(self, cache, tree, owners, start, plans=None, ropes=True):
        # No ring layout (``plans``): on a sliding window the defective verify
        # takes mlx-lm's own multi-token update, whose time order is one more
        # (tiny) difference from the one-token references on top of its defect.
        depths = np.arange(len(tree)) if self.defect == CONTROLS[0] else tree.depths()
        return injected(self.model, cache, depths, lambda c, n, w: _control_mask(self.defect, c, tree, n, w),
                        self.family.rope_attr, owners)


def _control_mask(defect, cache, tree, n, window):
    if defect == CONTROLS[1]:
        _, history, default = mode_of(cache).key_positions(cache)
        return create_causal_mask(n, history, window or default)
    mask = tree_mask(cache, tree, window)
    if defect == CONTROLS[2]:
        i, j = _siblings(tree)
        m = np.array(mask)
        m[j, m.shape[1] - n + i] = True  # node j sees its earlier sibling i
        mask = mx.array(m)
    return mask


class _LeakedNode(TreeAdapter):
    """treespec's adapter whose masks also show the root node 1's key (never
    on the root's path), through the very layouts the verify uses (a
    sliding-window ring's too): the smallest mask defect, one key too many,
    in a chain as in a tree."""

    def injection(self, cache, tree, owners, start, plans=None, ropes=True):
        plans = plans or {}

        def mask(c, n, window):
            plan = plans.get(id(c))
            if plan is None:
                m = np.array(tree_mask(c, tree, window, start))
                column = m.shape[1] - n + 1
            else:
                m = np.array(plan.mask(window))
                column = int(np.nonzero(plan.layout(window).order == plan.ring.filled + 1)[0][0])
            m[0, column] = True
            return mx.array(m)
        sites = Sites(self.family.rope_attr, owners, self._positions,
                      self._one_token if ropes else (), self.rope_pool)
        return tree_injected(self.model, cache, tree, sites, start, plans=plans, ropes=ropes,
                             mask_fn=mask)


def leaked_node_verifier(model) -> Optional[Callable]:
    """A verify (a tree, a cache -> node rows) whose root also sees node 1,
    by the tree path even for a chain; None where treespec has no adapter for
    ``model``."""
    real = adapter_or_none(model)
    if real is None:
        return None
    leaky = _LeakedNode(model, real.family)  # made here: making one may run a forward of its own
    return lambda t, c: leaky.verify(t, c, inject=True)


def _siblings(tree: DraftTree) -> Tuple[int, int]:
    for j in range(1, len(tree)):
        for i in range(1, j):
            if tree.parents[i] == tree.parents[j]:
                return i, j
    raise ValueError("a linear tree has no siblings")


class FlatRecurrence:
    """A recurrent strategy that lets a branching tree through the unmodified
    recurrence (siblings fold into one state): the recurrence control, and
    the suites' planted defect of the same name."""

    name = RECURRENCE

    def refusal(self, model, caches, tree):
        return None

    @contextmanager
    def inject(self, model, caches, tree):
        yield

    def kept_states(self) -> list:
        return []


def verifiers(model, tree: DraftTree) -> Optional[Tuple[Callable, Dict[str, Callable]]]:
    """The correct verify and each negative control's, as functions of (a
    tree, a cache) returning node rows, or None for a linear ``tree`` (no
    control differs from it) or a model treespec has no adapter for. Only
    the controls this model can express: flattening positions where a rope
    or a per-position input reads them, the recurrence control where it has
    recurrent layers."""
    if tree.is_linear():
        return None
    real = adapter_or_none(model)
    if real is None:
        return None
    defects = list(CONTROLS)
    if not real.check_model() and not real.family.positions:
        defects.remove(CONTROLS[0])  # nothing reads a node's position
    out = {}
    for defect in defects:
        # A fresh recurrent strategy of the family's kind per call: it holds its verify's states.
        kind = type(f"Control[{defect}]", (_Control,), {"defect": defect})
        out[defect] = lambda t, c, kind=kind: kind(model, real.family).verify(t, c)
    if real.recurrent is not None:
        out[RECURRENCE] = lambda t, c: TreeAdapter(model, real.family, FlatRecurrence(),
                                                   real.found).verify(t, c)
    return real.verify, out


def control_rows(model, base_cache, tree: DraftTree) -> Optional[Dict[str, mx.array]]:
    """Each negative control's verify rows over ``tree``, verified from a copy
    of ``base_cache``, or None where :func:`verifiers` has none; without the
    controls whose rows are bit for bit the correct verify's (a defect that
    changes nothing this model computes: a pure SSM has no attention to leak
    into)."""
    found = verifiers(model, tree)
    if found is None:
        return None
    real, defective = found
    out = {k: verify(tree, clone(base_cache)) for k, verify in defective.items()}
    correct = real(tree, clone(base_cache))
    mx.eval(correct, list(out.values()))
    return {k: v for k, v in out.items() if not mx.array_equal(v, correct).item()}


def controls(model, base_cache, tree: DraftTree, refs: mx.array) -> Optional[Dict[str, float]]:
    """Each negative control's max |diff| over the nodes of ``tree`` against
    ``refs`` (row i: the plain forward over node i's root path); None where
    :func:`control_rows` has none."""
    rows = control_rows(model, base_cache, tree)
    return None if rows is None else {k: max_abs_diff(v, refs) for k, v in rows.items()}
