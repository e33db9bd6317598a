"""The exactness probe's cost is bounded by what the run can use: a run of
max_tokens tokens verifies trees of at most max_tokens nodes, so only those
are probed; prefixes of one shape share one pass of single-token references
(the cost is linear in the tree, not quadratic); a tree over the stated
maximum is refused by name before anything runs. Counted in forwards of the
target, never timed."""

import pytest

from suites.guards import helpers
from suites.guards.helpers import counted
from treespec import gate, zoo
from treespec.decode import decode
from treespec.draft import FixedTreeDrafter
from treespec.tree import DraftTree

pytestmark = pytest.mark.exactness

STAR = [40]  # 40 children of the root: the shape that took 37 s for 4 tokens


def test_a_short_run_probes_only_the_trees_it_can_verify():
    max_tokens = 4
    target = zoo.build("llama")  # its own instance: a layer is wrapped
    # At most 2 * max_tokens shapes (chains and prefixes of <= max_tokens
    # nodes), each: one prefill, one verify, one width read, and per leaf a
    # prefill and its path's steps (<= 2 * max_tokens); then the run itself.
    per_shape = 3 + 2 * max_tokens
    bound = gate.DRAWS * 2 * max_tokens * per_shape + 2 * max_tokens + 2
    counter = counted(target, budget=bound)
    result = decode(target, helpers.prompt(8), mode="tree", draft_model=helpers.drafter(),
                    branching=STAR, max_tokens=max_tokens)
    assert len(result.tokens) == max_tokens and result.stats.gate["run"]
    assert counter.calls <= bound


def test_the_probe_of_a_shape_and_its_prefixes_is_linear_in_the_tree():
    target = zoo.build("llama")
    shapes = FixedTreeDrafter(branching=STAR).probe_shapes()
    largest = max(len(s) for s in shapes)
    # Per draw: one prefill, verify and width read per shape, and one pass of
    # single steps over the largest tree (a prefill and one step per leaf).
    bound = gate.DRAWS * (3 * len(shapes) + 2 * largest)
    counter = counted(target, budget=bound)
    p = gate.probe(target, shapes)
    assert [s.shape for s in p.shapes] == [tuple(s) for s in shapes] and p.identical
    assert counter.calls <= bound


def test_a_tree_past_the_probe_maximum_is_refused_before_any_forward():
    target = zoo.build("llama")
    counter = counted(target, budget=2)
    star = tuple(DraftTree([0] * (gate.MAX_PROBE_NODES + 1),
                           [-1] + [0] * gate.MAX_PROBE_NODES).parents)
    with pytest.raises(ValueError, match=rf"{gate.MAX_PROBE_NODES + 1} nodes.*at most "
                                         rf"{gate.MAX_PROBE_NODES}.*gate=False"):
        gate.probe(target, [star])
    with pytest.raises(ValueError, match=rf"501 nodes.*at most {gate.MAX_PROBE_NODES}"):
        decode(target, helpers.prompt(8), mode="tree", draft_model=helpers.drafter(),
               branching=[500], max_tokens=1000)
    assert counter.calls <= 2
