"""Contract 5: a node's position is offset + depth, never its flattened index."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given

from suites.helpers_strategies import branching_trees, offsets, trees
from suites.topology.helpers import depth_of

pytestmark = pytest.mark.exactness


@given(trees(), offsets)
def test_positions_are_offset_plus_depth(tree, offset):
    pos = tree.positions(offset)
    assert pos.dtype == mx.int32
    expected = [offset + depth_of(tree.parents, i) for i in range(len(tree))]
    assert pos.tolist() == expected
    assert tree.depths().tolist() == [e - offset for e in expected]


@given(branching_trees(), offsets)
def test_a_flattened_index_is_wrong_for_every_branching_tree(tree, offset):
    flattened = offset + np.arange(len(tree))
    assert not np.array_equal(np.array(tree.positions(offset)), flattened)


@given(trees(), offsets)
def test_a_linear_tree_has_contiguous_positions_iff_it_is_linear(tree, offset):
    flattened = list(range(offset, offset + len(tree)))
    assert (tree.positions(offset).tolist() == flattened) == tree.is_linear()
