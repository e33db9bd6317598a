"""The mask a verify injects is built once per tree shape (and per history
length where a window makes it depend on one) and reused: round after round
it must equal the tree's own mask for that cache state, bool or additive in
the dtype of the cache's keys (a stale cached mask is caught here)."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache

from treespec import caches
from treespec.tree import DraftTree
from treespec.verify.attention import tree_mask

pytestmark = pytest.mark.exactness

TREE = DraftTree([1, 2, 3, 4, 5, 6, 7], [-1, 0, 1, 2, 0, 4, 1])


def grow(cache, n, dtype, seed):
    """Write n rows of random keys and values, as a forward over n tokens."""
    k = mx.array(np.random.default_rng(seed).standard_normal((1, 2, n, 32)), dtype=dtype)
    cache.update_and_fetch(k, k)


def expected(cache, tree, window, start):
    """DraftTree.mask for the keys this cache holds (its mode's count)."""
    offset, history, default = caches.mode_of(cache).key_positions(cache)
    mask = tree.mask(offset - start, window or default, history=history - start)
    return mask[start:] if start else mask


CACHES = {
    "kv-bf16": lambda: KVCache(),
    "quantized-8": lambda: QuantizedKVCache(group_size=32, bits=8),
    "rotating-8": lambda: RotatingKVCache(max_size=8),
}


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("kind", CACHES)
def test_cached_masks_equal_the_trees_own_round_after_round(kind, window):
    cache = CACHES[kind]()
    dtype = mx.bfloat16
    tree = DraftTree(TREE.tokens, TREE.parents)
    # Histories that grow, wrap a ring of 8, and come back to a length seen
    # before; one verify-like round each (the tree's rows, then a trim).
    for step, n in enumerate([5, 1, 3, 6, 1, 1, 9, 2]):
        grow(cache, n, dtype, seed=step)
        for start in ([0] if kind.startswith("rotating") else [0, 1, 4]):
            want = expected(cache, tree, window, start)
            got = tree_mask(cache, tree, window, start)
            assert got.dtype == mx.bool_ and mx.array_equal(got, want), (step, start)
            add = tree_mask(cache, tree, window, start, additive=True)
            assert add.dtype == dtype and add.shape == want.shape
            blocked = mx.array(mx.finfo(dtype).min, dtype)
            assert mx.array_equal(add, mx.where(want, mx.array(0, dtype), blocked)), (step, start)
        # the same shape with other tokens shares the cached arrays
        other = TREE.with_tokens([9] * len(TREE))
        assert mx.array_equal(tree_mask(cache, other, window), expected(cache, other, window, 0))


def test_an_empty_cache_gets_a_bool_mask_it_has_no_dtype_for():
    cache = KVCache()
    assert tree_mask(cache, TREE, None, additive=True).dtype == mx.bool_
