"""The exactness probe's cost is bounded by what the run can use: a run of
max_tokens tokens verifies trees of at most max_tokens nodes, so only those
are probed; its single-token references step each node once (not once per
leaf below it, each leaf from a fresh prefill); a tree over the stated
maximum is refused by name before anything runs. Counted in forwards of the
target, never timed.

The counts hold on every backend. Where the regime is exact the probe also
passes (bfloat16 llama); elsewhere it may find differences (CUDA, in every
dtype) and the gate declines: recorded as the verdict, with its reason
(suites/helpers_gate.py)."""

import pytest

from suites.guards import helpers
from suites.guards.helpers import counted
from suites.helpers_gate import gate_verdict
from suites.helpers_numerics import model_label
from suites.verdict import GATE, expect
from treespec.evidence import gate
from treespec import zoo
from treespec.decoding import decode
from treespec.draft import FixedTreeDrafter
from treespec.tree import DraftTree

pytestmark = pytest.mark.exactness

STAR = [40]  # 40 children of the root: the shape that took 37 s for 4 tokens


def test_a_short_run_probes_only_the_trees_it_can_verify():
    max_tokens = 4
    # Its own instance (a layer is wrapped); bfloat16, which the probe finds
    # exact on both CPU regimes (OpenBLAS float32 declines; CUDA bfloat16 too).
    target = zoo.build("llama", "bfloat16")
    # At most 2 * max_tokens shapes (chains and prefixes of <= max_tokens
    # nodes), each per draw: one prefill, one verify, one step per node;
    # then the run: width reads, a prefill, a verify per round.
    bound = gate.DRAWS * 2 * max_tokens * (2 + max_tokens) + max_tokens + 5
    counter = counted(target, budget=bound)
    result = decode(target, helpers.prompt(8), mode="tree", draft_model=helpers.drafter(),
                    branching=STAR, max_tokens=max_tokens)
    assert len(result.tokens) == max_tokens
    verdict = gate_verdict(result.stats.gate, result.stats.mode, "tree")  # exact regimes: it ran
    assert counter.calls <= bound
    expect(verdict, GATE, *model_label(target))


def test_the_probe_steps_each_node_once_per_shape_and_draw():
    target = zoo.build("llama", "bfloat16")
    shapes = FixedTreeDrafter(branching=STAR).probe_shapes()
    distinct = set(shapes)
    # Per draw and distinct shape: one prefill, one verify, and one single
    # step per node; two width reads (the probe's and its adapter's).
    bound = gate.DRAWS * sum(2 + len(s) for s in distinct) + 2
    counter = counted(target, budget=bound)
    p = gate.probe(target, shapes)
    assert [s.shape for s in p.shapes] == [tuple(s) for s in shapes]
    # The decision on this probe (memoized: no forward more); exact regimes:
    # every shape identical.
    decision = gate.decide(target, shapes)
    assert decision.probe is p
    verdict = gate_verdict(decision.summary())
    assert counter.calls <= bound
    expect(verdict, GATE, *model_label(target))


def test_a_tree_past_the_probe_maximum_is_refused_before_any_forward():
    target = zoo.build("llama")
    counter = counted(target, budget=2)
    star = tuple(DraftTree([0] * (gate.MAX_PROBE_NODES + 1),
                           [-1] + [0] * gate.MAX_PROBE_NODES).parents)
    with pytest.raises(ValueError, match=rf"{gate.MAX_PROBE_NODES + 1} nodes.*at most "
                                         rf"{gate.MAX_PROBE_NODES}.*gate=False"):
        gate.probe(target, [star])
    # decode refuses it first, naming the argument: the probe's maximum less the root
    with pytest.raises(ValueError, match=rf"branching=\[500\]: 500 draft nodes.*"
                                         rf"at most {gate.MAX_PROBE_NODES - 1}"):
        decode(target, helpers.prompt(8), mode="tree", draft_model=helpers.drafter(),
               branching=[500], max_tokens=1000)
    assert counter.calls <= 2
