"""The per-node state limit counts what a verify keeps: a branching tree
through the tree-aware recurrence keeps one state per node, a chain (the
mixer's own multi-token path, replayed at commit) keeps none, so no chain is
refused by the limit, however long."""

import mlx.core as mx
import pytest

from suites.guards import helpers
from treespec.audit.states import clone, plain
from treespec.errors import TreeRefused
from treespec.models import prefilled
from treespec.tree import DraftTree
from treespec.verify import adapter_for
from treespec.verify.footprint import footprint_breakdown
from treespec.verify.tree_recurrence import TreeRecurrence

pytestmark = pytest.mark.exactness

FAMILY = "qwen3_5"


def limited(nodes: int):
    """The qwen3_5 adapter whose limit is exactly ``nodes`` nodes' states."""
    model = helpers.model(FAMILY)
    limit = footprint_breakdown(model, nodes)["total_bytes"]
    return model, adapter_for(model, recurrent=TreeRecurrence(limit))


@pytest.mark.parametrize("length", [5, 8, 40])
def test_a_chain_longer_than_the_limit_allows_a_tree_is_verified(length):
    model, adapter = limited(4)
    chain = DraftTree.linear(helpers.prompt(length, seed=5))
    cache = prefilled(model, helpers.prompt(9, seed=6))
    untouched = clone(cache)
    logits = adapter.verify(chain, cache)
    assert mx.array_equal(logits, plain(model, untouched, chain.tokens)).item()


def test_a_branching_tree_is_still_held_to_the_limit():
    model, adapter = limited(4)
    cache = prefilled(model, helpers.prompt(9, seed=6))
    adapter.verify(DraftTree([1, 2, 3, 4], [-1, 0, 0, 1]), cache)  # 4 nodes: within
    cache = prefilled(model, helpers.prompt(9, seed=6))
    with pytest.raises(TreeRefused, match=r"5-node tree.*over the limit"):
        adapter.verify(DraftTree([1, 2, 3, 4, 5], [-1, 0, 0, 1, 1]), cache)
