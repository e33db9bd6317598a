"""Contract 8 at the tree level: malformed input is refused, by node."""

import numpy as np
import pytest

from treespec.tree import DraftTree, TreeError
from treespec.walk import tree_walk

pytestmark = pytest.mark.exactness

MALFORMED = {
    "empty tokens": ([], [], "root"),
    "parents shorter than tokens": ([1, 2, 3], [-1, 0], "node 2"),
    "parents longer than tokens": ([1, 2], [-1, 0, 1], "node 2"),
    "root with a parent": ([1, 2], [0, 0], "node 0"),
    "parent after the node": ([1, 2, 3], [-1, 2, 0], "node 1"),
    "self parent": ([1, 2, 3], [-1, 0, 2], "node 2"),
    "a second root": ([1, 2, 3], [-1, 0, -1], "node 2"),
    "parent below -1": ([1, 2], [-1, -2], "node 1"),
    "negative token": ([1, -4, 3], [-1, 0, 0], "node 1"),
    "float token": ([1, 2.0], [-1, 0], "node 1"),
    "string token": ([1, "a"], [-1, 0], "node 1"),
    "bool token": ([True, 2], [-1, 0], "node 0"),
    "float parent": ([1, 2, 3], [-1, 0, 0.5], "node 2"),
    "None parent": ([1, 2], [-1, None], "node 1"),
}


@pytest.mark.parametrize("tokens, parents, named", MALFORMED.values(), ids=MALFORMED.keys())
def test_every_malformed_tree_raises_tree_error_naming_the_node(tokens, parents, named):
    with pytest.raises(TreeError, match=named):
        DraftTree(tokens, parents)


def test_tree_error_is_a_value_error():
    assert issubclass(TreeError, ValueError)


def test_numpy_integers_are_accepted():
    tree = DraftTree(np.array([4, 5, 6]), np.array([-1, 0, 0]))
    assert tree.tokens == (4, 5, 6) and tree.parents == (-1, 0, 0)


@pytest.mark.parametrize(
    "parent, token, named",
    [(3, 1, "node 3"), (-1, 1, "node 3"), (0, -1, "node 3"), (0, 1.5, "node 3")],
)
def test_a_refused_push_child_leaves_the_tree_unchanged(parent, token, named):
    tree = DraftTree([7, 8, 9], [-1, 0, 0])
    before = (tree.tokens, tree.parents, tree.depths().tolist())
    with pytest.raises(TreeError, match=named):
        tree.push_child(parent, token)
    assert (tree.tokens, tree.parents, tree.depths().tolist()) == before


@pytest.mark.parametrize("node", [-1, 3])
def test_paths_and_children_of_missing_nodes_are_refused(node):
    tree = DraftTree([7, 8, 9], [-1, 0, 0])
    with pytest.raises(TreeError, match=f"node {node}"):
        tree.path_to(node)
    with pytest.raises(TreeError, match=f"node {node}"):
        tree.children(node)


@pytest.mark.parametrize("tree", [[1, 2, 3], (1, 2), np.array([1, 2]), None],
                         ids=["list", "tuple", "numpy", "None"])
def test_tree_walk_refuses_what_is_not_a_tree_naming_the_argument(tree):
    # A token list has a length, so without the check it failed deep inside with
    # "'list' object has no attribute 'tokens'".
    with pytest.raises(TypeError, match=r"tree_walk: tree must be a DraftTree, got "):
        tree_walk(tree, [1, 2, 3])
