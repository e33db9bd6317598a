"""Planted defects: adapters (and walks) that are each wrong in one known way,
for ``treespec audit --adapter suites.audit.helpers_defects:NAME``.

Each factory takes a model and returns a small subclass of the real
``TreeAdapter`` built exactly as ``adapter_for`` builds it, wrong in one
place only. An audit that passed one of these would prove nothing;
``DEFECTS`` says which property must catch each.
"""

import numpy as np
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import RotatingKVCache, trim_prompt_cache

from treespec.caches import rotating_kept
from treespec.errors import TreeRefused
from treespec.evidence.numerics import FlatRecurrence
from treespec.verify import TreeAdapter, adapter_for
from treespec.verify.attention import Sites, tree_injected
from treespec.walk import Walk, tree_walk


def _rebuild(cls, model, recurrent=None):
    """``adapter_for(model)``, but of class ``cls``."""
    real = adapter_for(model, recurrent=recurrent)
    return cls(model, real.family, real.recurrent)


def _causal(cache, N, window):
    """mlx-lm's chain mask over the flattened tree, with the cache's history."""
    if isinstance(cache, RotatingKVCache):
        return create_causal_mask(N, rotating_kept(cache), window or cache.max_size)
    return create_causal_mask(N, cache.offset, window)


class CausalMask(TreeAdapter):
    """Ignores the tree mask: depth positions, but the causal mask, so
    siblings see each other (contract 4). A sliding-window ring keeps its
    own layout's mask (its keys are not in time order)."""

    def injection(self, cache, tree, owners, start, plans=None, ropes=True):
        plans = plans or {}

        def mask(c, N, w):
            return plans[id(c)].mask(w) if id(c) in plans else _causal(c, N, w)

        return tree_injected(self.model, cache, tree, Sites(self.family.rope_attr, owners), start,
                             plans=plans, ropes=ropes, mask_fn=mask)


class FlatPositions(TreeAdapter):
    """Contiguous positions: node i at ``offset + i`` (its flattened index),
    not ``offset + depth`` (contract 5); the tree mask is right."""

    def injection(self, cache, tree, owners, start, plans=None, ropes=True):
        return tree_injected(self.model, cache, tree, Sites(self.family.rope_attr, owners), start,
                             plans=plans, ropes=ropes, depths=np.arange(len(tree) - start))


class ShiftedPositions(TreeAdapter):
    """Positions ``offset + depth + 1``: wrong for every branching tree (a
    chain is a plain forward, given the model's own positions)."""

    def injection(self, cache, tree, owners, start, plans=None, ropes=True):
        return tree_injected(self.model, cache, tree, Sites(self.family.rope_attr, owners), start,
                             plans=plans, ropes=ropes, depths=tree.depths()[start:] - start + 1)


class TailTrim(TreeAdapter):
    """Rolls back the way mlx-lm's speculative decoding does: trims the
    rejected count off the tail (trim_prompt_cache) instead of compacting the
    accepted path (commit_path). Right for a chain, wrong once the accepted
    branch is not the first one in flattened order (contract 7)."""

    def commit(self, cache, tree, path, offset=None):
        self._last = None
        trim_prompt_cache(cache, len(tree) - len(path))
        return len(path)


class LastSibling(TreeAdapter):
    """The real verify and rollback, but a walk that takes the LAST matching
    sibling (contract 3: the first child wins)."""

    def walk(self, tree, target_tokens):
        tokens, path = tree.tokens, [0]
        while True:
            want = target_tokens[path[-1]]
            match = [c for c in tree.children(path[-1]) if tokens[c] == want]
            if not match:
                break
            path.append(match[-1])
        emitted = [tokens[i] for i in path[1:]] + [target_tokens[path[-1]]]
        return Walk(tuple(path), tuple(emitted))


class NoBonus(TreeAdapter):
    """A walk that drops the target's bonus token when every draft was
    accepted (unlike mlx-lm's accept loop, contract 2)."""

    def walk(self, tree, target_tokens):
        w = tree_walk(tree, target_tokens)
        if w.accepted and not tree.children(w.path[-1]):
            return Walk(w.path, w.emitted[:-1])
        return w


class RefusesEveryVerify(TreeAdapter):
    """An adapter that refuses every verify, chains included, as a backend
    without the tree path's kernels would (treespec once refused every
    recurrent mixer on Metal by name): nothing of the model is compared, so
    an audit of it must not pass."""

    def verify_handle(self, tree, cache, start=0, tokens=None, inject=None):
        raise TreeRefused(self.model_type, "planted: no verify on this backend")


def causal_mask(model):
    return _rebuild(CausalMask, model)


def flat_positions(model):
    return _rebuild(FlatPositions, model)


def shifted_positions(model):
    return _rebuild(ShiftedPositions, model)


def tail_trim(model):
    return _rebuild(TailTrim, model)


def flattened_recurrence(model):
    # the flattened tree through the unmodified recurrence, folding siblings
    # into one state (numerics' recurrence control is this same defect)
    return adapter_for(model, recurrent=FlatRecurrence())


def last_sibling(model):
    return _rebuild(LastSibling, model)


def no_bonus(model):
    return _rebuild(NoBonus, model)


def refuses_every_verify(model):
    return _rebuild(RefusesEveryVerify, model)


def real(model):
    """The real adapter through the --adapter path (a control)."""
    return adapter_for(model)


# defect -> (zoo family it is planted in, properties that must FAIL,
#            properties that must still pass: the audit names the culprit)
DEFECTS = {
    "causal_mask": ("llama", {"tree-verify", "probe"}, {"linear-verify", "walk-linear", "walk-siblings"}),
    "flat_positions": ("gemma3_text", {"tree-verify"}, {"linear-verify", "walk-linear", "walk-siblings"}),
    # A chain is verified by a plain forward (no injected positions), so an
    # off-by-one shows on branching trees: the verify, the rollback built on
    # it, the text and the probe.
    "shifted_positions": ("gemma3_text", {"tree-verify", "rollback", "probe"},
                          {"linear-verify", "walk-linear", "walk-siblings"}),
    "tail_trim": ("qwen3", {"rollback"}, {"linear-verify", "tree-verify", "probe", "walk-linear"}),
    "flattened_recurrence": ("qwen3_5", {"tree-verify"}, {"linear-verify", "walk-linear", "walk-siblings"}),
    "last_sibling": ("llama", {"walk-siblings"}, {"linear-verify", "tree-verify", "rollback", "walk-linear", "probe"}),
    "no_bonus": ("llama", {"walk-linear"}, {"linear-verify", "tree-verify", "rollback", "probe"}),
}
