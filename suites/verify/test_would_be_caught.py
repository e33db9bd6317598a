"""The suite catches a flattened tree. Each test runs a deliberately broken
injection (the same ``injected`` the adapter uses, fed wrong positions or a
wrong mask) and shows that the root-path comparison of test_root_paths gives
FAIL for a branching tree, in every regime: bit-exact backends by any
difference, others by the measured envelope's bound. A suite that passed
these would prove nothing."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import RotatingKVCache

from suites.verify import helpers
from suites.verify.helpers import HYBRID, clone, root_path_verdict
from treespec.evidence import numerics
from treespec import zoo
from treespec.caches import rotating_kept
from treespec.verify.attention import injected, tree_injected, tree_mask

pytestmark = pytest.mark.exactness

# Hybrids have their own case: the flattened recurrence.
ATTENTION_FAMILIES = [f for f in zoo.FAMILIES if f not in HYBRID]


def run_broken(family, hist, tree, depths, mask_fn):
    model = helpers.model(family)
    cache = hist.replay(model)
    before = clone(cache)
    with injected(model, cache, depths, mask_fn):
        logits = model(mx.array(tree.tokens)[None], cache=cache)[0]
    mx.eval(logits)
    assert_caught(model, before, tree, logits)


def assert_caught(model, before, tree, logits):
    verdict = root_path_verdict(model, before, tree, logits)
    assert verdict.word == numerics.FAIL, verdict.line()
    # Gross, not rounding: the planted defect lands far beyond any envelope.
    assert verdict.max_diff > 1e-3, verdict.line()


def causal_mask(cache, N, window):
    """mlx-lm's chain mask over the flattened tree, with the cache's history."""
    if isinstance(cache, RotatingKVCache):
        return create_causal_mask(N, rotating_kept(cache), window or cache.max_size)
    return create_causal_mask(N, cache.offset, window)


@pytest.mark.parametrize("family", ATTENTION_FAMILIES)
def test_contiguous_positions_would_be_caught(family):
    """Positions = flattened index (what a plain forward over the flattened
    tree uses), with the right tree mask."""
    tree = helpers.branching_trees(family)["bushy"]
    hist = helpers.histories(family)[3]
    flat = np.arange(len(tree))
    mask_fn = lambda cache, N, window: tree_mask(cache, tree, window)
    run_broken(family, hist, tree, flat, mask_fn)


@pytest.mark.parametrize("family", ATTENTION_FAMILIES)
def test_causal_mask_would_be_caught(family):
    """The right depth positions, but the causal mask: siblings see each other."""
    tree = helpers.branching_trees(family)["bushy"]
    hist = helpers.histories(family)[3]
    run_broken(family, hist, tree, tree.depths(), causal_mask)


@pytest.mark.parametrize("family", [f for f in ATTENTION_FAMILIES if helpers.window(f)])
def test_a_window_counted_in_flattened_index_would_be_caught(family):
    """The tree mask with its sliding window cut by flattened index instead
    of position."""
    tree = helpers.branching_trees(family)["deeper-than-window"]
    hist = helpers.histories(family)[4]

    def flat_window(cache, N, window):
        mask = np.array(tree_mask(cache, tree, window))
        if window is None and not isinstance(cache, RotatingKVCache):
            return mx.array(mask)  # a global layer: no window to get wrong
        w = window or cache.max_size
        n_hist = mask.shape[1] - N
        q = np.arange(N)[:, None]  # flattened index, not depth
        mask[:, n_hist:] &= (q - np.arange(N)[None, :]) < w
        mask[:, :n_hist] = (q - np.arange(-n_hist, 0)[None, :]) < w
        return mx.array(mask)

    run_broken(family, hist, tree, tree.depths(), flat_window)


@pytest.mark.parametrize("family", HYBRID)
def test_a_flattened_tree_through_a_recurrence_would_be_caught(family):
    """Exactly what the adapter refuses: attention gets the tree mask and
    depth positions, but the GatedDeltaNet reads the flattened tree."""
    tree = helpers.branching_trees(family)["two-chains"]
    hist = helpers.histories(family)[1]
    model = helpers.model(family)
    cache = hist.replay(model)
    before = clone(cache)
    with tree_injected(model, cache, tree):
        logits = model(mx.array(tree.tokens)[None], cache=cache)[0]
    mx.eval(logits)
    assert_caught(model, before, tree, logits)
