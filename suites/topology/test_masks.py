"""Contracts 1 and 4: masks, as index math, against mlx-lm and naive recomputation."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mlx_lm.models.base import create_causal_mask

from suites.helpers_strategies import linear_trees, offsets, trees, windows
from suites.topology.helpers import ancestors_of, depth_of
from treespec.tree import DraftTree

pytestmark = pytest.mark.exactness


@given(linear_trees(max_nodes=40), offsets, windows)
def test_a_linear_tree_masks_exactly_as_a_causal_mask(tree, offset, window):
    expected = create_causal_mask(len(tree), offset=offset, window_size=window)
    got = tree.mask(offset=offset, window_size=window)
    assert got.dtype == mx.bool_
    assert got.shape == expected.shape == (len(tree), offset + len(tree))
    assert mx.array_equal(got, expected)


@given(trees(), offsets, windows, st.sampled_from([mx.float32, mx.float16, mx.bfloat16]))
def test_the_additive_mask_agrees_with_the_bool_mask(tree, offset, window, dtype):
    allowed = np.array(tree.mask(offset, window))
    add = tree.additive_mask(offset, window, dtype=dtype)
    assert add.dtype == dtype
    values = np.array(add.astype(mx.float32))
    assert (values[allowed] == 0).all()
    assert (values[~allowed] == float(mx.finfo(dtype).min)).all()
    assert np.isfinite(values).all()


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_a_fully_masked_row_gives_no_nan(dtype):
    # A tree never masks a node's own column, so build the row from the
    # value the tree uses for "blocked" and check attention stays finite.
    add = DraftTree([5, 6, 7], [-1, 0, 0]).additive_mask(offset=3, dtype=dtype)
    blocked_value = mx.min(add)
    rows = mx.stack([add[0], mx.full(add.shape[1:], blocked_value, dtype=dtype)])
    q = mx.ones((1, 1, 2, 8), dtype=dtype)
    k = mx.ones((1, 1, add.shape[1], 8), dtype=dtype)
    out = mx.fast.scaled_dot_product_attention(q, k, k, scale=1.0, mask=rows)
    assert not mx.any(mx.isnan(out)).item()


@given(trees(), offsets)
def test_siblings_never_see_each_other(tree, offset):
    mask = np.array(tree.mask(offset))
    for i in range(len(tree)):
        for j in tree.children(tree.parents[i]) if i else []:
            if j != i:
                assert not mask[i, offset + j], f"node {i} sees its sibling {j}"


@given(trees(), offsets)
def test_every_node_sees_all_history_and_exactly_its_ancestors(tree, offset):
    mask = np.array(tree.mask(offset))
    parents = tree.parents
    for i in range(len(tree)):
        assert mask[i, :offset].all(), f"node {i} is cut off from history"
        seen = {j for j in range(len(tree)) if mask[i, offset + j]}
        assert seen == ancestors_of(parents, i), f"node {i}"


@given(trees(), offsets, st.integers(1, 40), st.data())
def test_a_window_cuts_history_and_ancestors_by_position_not_index(tree, offset, window, data):
    # A rotating cache may hold only the last `history` keys it has seen.
    history = data.draw(st.integers(0, offset))
    mask = np.array(tree.mask(offset, window, history=history))
    assert mask.shape == (len(tree), history + len(tree))
    parents = tree.parents
    for i in range(len(tree)):
        q = offset + depth_of(parents, i)
        for col in range(history):
            k = offset - history + col
            assert mask[i, col] == (q - k < window), (i, col)
        for j in range(len(tree)):
            k = offset + depth_of(parents, j)
            want = j in ancestors_of(parents, i) and q - k < window
            assert mask[i, history + j] == want, (i, j)
