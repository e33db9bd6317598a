"""The instrument itself (treespec.evidence.numerics): the pass rule, the separation
rule, and that a tree path differing from the plain forward does not widen
the bound. The planted kernels (a few-ulp multi-token matmul that widens the
envelope and makes the gate decline; a RoPE off by one and an attention
dropping its mask that the envelope does not admit) are in suites/plants,
with every other planted regression."""

import mlx.core as mx
import pytest

from suites.families.helpers_models import build
from suites.planted import shape_dependent
from suites.verify import helpers
from treespec.evidence import numerics
from treespec.tree import DraftTree
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness

TREE = DraftTree(helpers.tokens(9, 5), [-1, 0, 0, 1, 1, 2, 3, 3, 5])


def _envelope(value, controls=None, tree=None, tvp=None):
    return numerics.Envelope("synthetic", (1, 2), (0,), value, value if tree is None else tree,
                             0.0 if tvp is None else tvp, controls)


# -- the rules, on synthetic numbers --------------------------------------------


def test_where_the_envelope_is_zero_any_difference_fails():
    a = mx.zeros((2, 8))
    assert numerics.judge(a, a, _envelope(0.0)).word == numerics.BIT_EXACT
    b = a.at[1, 3].add(1e-7)
    v = numerics.judge(b, a, _envelope(0.0))
    assert v.word == numerics.FAIL and "bit-exact" in v.detail and "row 1" in v.detail


def test_a_difference_within_the_bound_passes_only_if_the_controls_separate():
    a = mx.zeros((3, 8))
    e = 1e-5
    bound = numerics.TRIANGLE * numerics.SAFETY * e
    b = a.at[2, 0].add(0.9 * bound)
    far = {"x": numerics.SEPARATION * bound * 1.01}
    near = {"x": numerics.SEPARATION * bound * 0.99}
    assert numerics.judge(b, a, _envelope(e, far)).word == numerics.WITHIN
    v = numerics.judge(b, a, _envelope(e, near))
    assert v.word == numerics.INCONCLUSIVE and "x " in v.detail
    assert numerics.judge(b, a, _envelope(e, None)).word == numerics.INCONCLUSIVE
    # a comparison's own controls take precedence over the envelope's
    assert numerics.judge(b, a, _envelope(e, far), controls=near).word == numerics.INCONCLUSIVE
    c = a.at[2, 0].add(1.1 * bound)
    v = numerics.judge(c, a, _envelope(e, far))
    assert v.word == numerics.FAIL and "row 2" in v.detail
    assert numerics.judge(a.at[0, 0].add(float("nan")), a, _envelope(e, far)).word == numerics.FAIL


def test_a_control_short_of_the_separation_counts_only_where_isolation_catches_it():
    # treespec.evidence.isolation: a defect the verify is proved isolated from
    # needs no separation from the envelope; every other control still does.
    a = mx.zeros((3, 8))
    e = 1e-3
    bound = numerics.TRIANGLE * numerics.SAFETY * e
    b = a.at[1, 2].add(0.5 * bound)
    c = {"positions": numerics.SEPARATION * bound * 1.01, "sibling": numerics.SEPARATION * bound * 0.3}
    env = _envelope(e, c)
    assert numerics.judge(b, a, env).word == numerics.INCONCLUSIVE
    v = numerics.judge(b, a, env, isolation={"sibling": True, "positions": False})
    assert v.word == numerics.WITHIN and "sibling" in v.detail and "caught by isolation" in v.detail
    assert numerics.judge(b, a, env, isolation={"sibling": False, "positions": True}).word == \
        numerics.INCONCLUSIVE
    assert numerics.judge(b, a, env, isolation=lambda: None).word == numerics.INCONCLUSIVE

    def never():
        raise AssertionError("isolation consulted where it cannot change the verdict")

    # not consulted where every control separates, nor for a difference beyond the bound
    assert numerics.judge(b, a, _envelope(e, {"positions": c["positions"]}), isolation=never).word == \
        numerics.WITHIN
    assert numerics.judge(a.at[0, 0].add(1.1 * bound), a, env, isolation=never).word == numerics.FAIL


def test_a_leak_fails_a_verdict_only_where_it_would_otherwise_be_inconclusive():
    # treespec.evidence.isolation.leak: a verify shown to let a node see nodes
    # off its root path is defective whatever the envelope; consulted only
    # where the envelope cannot decide (controls short of the separation; an
    # envelope of 0 that the census or a ring's placement contradicts).
    a = mx.zeros((3, 8))
    e = 1e-3
    bound = numerics.TRIANGLE * numerics.SAFETY * e
    b = a.at[1, 2].add(0.5 * bound)
    weak = _envelope(e, {"sibling": numerics.SEPARATION * bound * 0.3})
    shown = "a leak: node 1's row changes"
    v = numerics.judge(b, a, weak, leak=shown)
    assert v.word == numerics.FAIL and shown in v.detail and "not 10 x the bound" in v.detail, v.detail
    assert numerics.judge(b, a, weak, leak=lambda: None).word == numerics.INCONCLUSIVE
    tiny = a.at[1, 2].add(1e-7)
    for reason in ("census", "placement"):
        v = numerics.judge(tiny, a, _envelope(0.0), leak=shown, **{reason: "the census says so"})
        assert v.word == numerics.FAIL and shown in v.detail, v.detail
        assert numerics.judge(tiny, a, _envelope(0.0), leak=None, **{reason: "the census says so"}
                              ).word == numerics.INCONCLUSIVE

    def never():
        raise AssertionError("leak consulted where it cannot change the verdict")

    separated = _envelope(e, {"sibling": numerics.SEPARATION * bound * 1.01})
    assert numerics.judge(a, a, separated, leak=never).word == numerics.BIT_EXACT
    assert numerics.judge(b, a, separated, leak=never).word == numerics.WITHIN
    assert numerics.judge(a.at[0, 0].add(1.1 * bound), a, separated, leak=never).word == numerics.FAIL
    assert numerics.judge(tiny, a, _envelope(0.0), leak=never).word == numerics.FAIL


def test_a_tree_path_that_differs_from_the_plain_forward_does_not_widen_the_bound():
    ok = _envelope(1e-6, tree=3e-6, tvp=numerics.TRIANGLE * numerics.SAFETY * 1e-6)
    assert ok.tree_ok and ok.value == 3e-6
    bad = _envelope(1e-6, tree=0.5, tvp=0.5)
    assert not bad.tree_ok and bad.value == 1e-6
    assert not _envelope(0.0, tree=1e-7, tvp=1e-7).tree_ok  # exact plain path: exact tree path


def test_the_widths_of_a_tree_are_its_forwards():
    # n, each depth's node count, each root path's length (depth + 1)
    assert numerics.widths_of(TREE) == (1, 2, 3, 4, 9)
    assert numerics.widths_of(DraftTree.linear([1, 2, 3]), 7) == (1, 2, 3, 7)


# -- how much is measured -----------------------------------------------------


def test_a_width_that_matches_single_steps_is_believed_only_on_every_sample():
    """A zero envelope makes any difference FAIL, so a width whose samples
    all equal single-token steps is measured on MAX_SAMPLES contexts, not
    the first SAMPLES: on OpenBLAS's Cooperlake kernels two rows read 0 on
    four contexts and 1e-6 in a test's own. Where the width differs from
    single steps (an inexact regime) the count is the tail rule's, and this
    check has nothing to say."""
    model = helpers.model("llama", "float32")
    m = numerics.Measurement(model, context=8)
    plain, _, _ = m.width(3)
    if plain != 0:
        pytest.skip(f"width 3 differs from single steps here by {plain:.3g}: no zero to distrust")
    assert len(m.samples) == numerics.MAX_SAMPLES
    assert len(set(m.contexts)) > numerics.SAMPLES // 2  # spread over the bucket, not one context


@pytest.mark.parametrize("family, batched", [("mamba", True), ("llama", False)])
def test_the_envelope_takes_in_the_batch_rows_a_tree_path_runs(family, batched):
    """The tree-aware recurrence runs each depth's nodes as one batch, so a
    recurrent model's envelope measures one-token steps run as a batch
    against each alone (under BLIS a mamba chain, stepped one row at a time,
    measured 0 while a branching tree differed by 1.2e-6). An attention
    model's tree path runs no batch: its envelope is not widened by one."""
    real = build(family)
    eps = 1e-3
    plain = numerics.Measurement(real, adapter_for(real), context=8).width(3)[0]
    planted = numerics.Measurement(shape_dependent(real, eps, 0, "BatchDependent"), adapter_for(real), context=8)
    widened = planted.width(3)[0]
    if batched:
        assert widened >= 2 * eps > plain, (widened, plain)
    else:
        assert widened == plain, (widened, plain)
