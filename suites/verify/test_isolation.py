"""Isolation (treespec.evidence.isolation): a correct verify gives node i the
same bits when every token off its root path is replaced, and when the tree
is flattened in another order; a mask or position defect does not. Where the
envelope is too wide for a control to clear the separation rule (half
precision on a GPU), a control isolation catches in the same run needs no
separation; one it does not catch still does; a verify that is not isolated
proves nothing, so a defect inside a wide bound stays inconclusive, never
within. Tried: with ``isolation`` comparing the correct rows with themselves
(no substitution), the leaked-sibling test fails; with the reflattened rows
put back by the order instead of its inverse, the first family test fails
on each family.

The substitution is also a proof of a defect in the verify under test
(``leak``): a row moved by tokens off its root path, from a verify that
repeats its bits, sees keys its mask must hide; where the envelope cannot
decide, that FAILs. Tried: with ``root_path_verdict`` passing no ``leak``,
the planted mask defect's verdict below is inconclusive."""

import mlx.core as mx
import pytest

from suites.verify import helpers
from treespec.audit.states import root_path_forwards
from treespec.evidence import numerics
from treespec.evidence.controls import CONTROLS, RECURRENCE, clone, verifiers
from treespec.evidence.isolation import isolation, leak, reordered, reordered_rows
from treespec.evidence.same_width import position_reason
from treespec.tree import DraftTree
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness

TREE = DraftTree(helpers.tokens(7, 11), [-1, 0, 0, 1, 1, 2, 4])
POSITIONS, CAUSAL, LEAKED = CONTROLS


def subject(family):
    model = helpers.model(family, "float32")
    return model, helpers.history(6).replay(model)


def proved(model, before):
    proof = isolation(model, before, TREE)
    if proof is None:
        pytest.skip("this backend gives a node other bits when other nodes' tokens or the "
                    "flattening change: isolation proves nothing here (judged by the envelope)")
    return proof


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_5"])
def test_every_mask_control_is_caught_and_positions_wherever_reordering_is_a_proof(family):
    model, before = subject(family)
    proof = proved(model, before)
    assert proof[LEAKED] and proof[CAUSAL]
    if family == "qwen3_5":
        assert proof[RECURRENCE]
    real, _ = verifiers(model, TREE)
    reorder_is_a_proof = mx.array_equal(reordered_rows(real, before, TREE),
                                        real(TREE, clone(before))).item()
    assert proof[POSITIONS] == reorder_is_a_proof
    if position_reason(model, len(TREE)) is None:
        # a backend whose census rounds no row by its place: moving the nodes moves no bits
        assert reorder_is_a_proof


def test_a_verify_that_leaks_a_sibling_is_not_isolated():
    model, before = subject("llama")
    proved(model, before)
    _, defective = verifiers(model, TREE)
    assert isolation(model, before, TREE, found=(defective[LEAKED], defective)) is None


def test_a_verify_that_flattens_positions_moves_its_rows_when_the_tree_is_reordered():
    model, before = subject("llama")
    _, defective = verifiers(model, TREE)
    flat = defective[POSITIONS]
    assert reordered(TREE) is not None
    assert not mx.array_equal(reordered_rows(flat, before, TREE), flat(TREE, clone(before))).item()


def test_a_wide_envelope_passes_a_correct_verify_by_isolation_and_never_a_leaked_sibling():
    # The half-precision situation on this backend's real rows: an envelope so
    # wide that no control clears 10 x the bound, and a leaked sibling inside it.
    model, before = subject("llama")
    proved(model, before)
    real, defective = verifiers(model, TREE)
    refs = root_path_forwards(model, before, TREE)
    c = numerics.controls(model, before, TREE, refs)
    leaked = defective[LEAKED](TREE, clone(before))
    e = 2 * max(max(c.values()), numerics.max_abs_diff(leaked, refs)) / (
        numerics.TRIANGLE * numerics.SAFETY)
    env = numerics.Envelope("wide", (1, 2), (0,), e, e, 0.0, c)
    got = real(TREE, clone(before))
    got = got + (got == got.max()).astype(got.dtype) * (e / 4)  # a rounding-sized difference
    assert numerics.judge(got, refs, env).word == numerics.INCONCLUSIVE
    proof = isolation(model, before, TREE)
    v = numerics.judge(got, refs, env, isolation=proof)
    assert "caught by isolation" in v.detail, v.detail
    # within only where isolation catches every control (here every control is short)
    if all(proof.values()):
        assert v.word == numerics.WITHIN, v.detail
    else:  # e.g. BLIS: reflattening moves rows, so the positions control is not caught
        assert v.word == numerics.INCONCLUSIVE, v.detail
    v = numerics.judge(leaked, refs, env, isolation=lambda: isolation(
        model, before, TREE, found=(defective[LEAKED], defective)))
    assert v.word == numerics.INCONCLUSIVE, v.detail


def test_a_leak_is_shown_in_a_verify_that_lets_a_node_see_off_its_path_and_in_no_other():
    model, before = subject("llama")
    proved(model, before)  # a backend that repeats a row's bits from its own inputs
    real, defective = verifiers(model, TREE)
    assert leak(model, before, TREE) is None
    assert leak(model, before, TREE, verify=real) is None
    for control in (LEAKED, CAUSAL):
        why = leak(model, before, TREE, verify=defective[control])
        assert why is not None and why.startswith("a leak: node"), control
    # flattened positions see no other node's keys: no leak, whatever else is wrong
    assert leak(model, before, TREE, verify=defective[POSITIONS]) is None

    def noisy(tree, cache):  # not deterministic: nothing can be shown
        rows = defective[LEAKED](tree, cache)
        return rows + mx.random.uniform(shape=rows.shape).astype(rows.dtype)
    assert leak(model, before, TREE, verify=noisy) is None


def test_a_mask_defect_fails_where_the_census_contradicts_an_envelope_of_zero(plant):
    # Measured under BLIS: a planted attention that drops its mask moved zoo
    # qwen3's node rows by 5.29 where the envelope measured 0, and the census's
    # width rows made that inconclusive. The leak shows the defect without the
    # envelope: FAIL, naming it.
    model, before = subject("llama")
    with plant("attention-drops-array-mask"):
        logits = adapter_for(model).verify(TREE, clone(before))
        verdict = helpers.root_path_verdict(model, before, TREE, logits,
                                            width_measure=helpers.widened_rows)
    assert verdict.word == numerics.FAIL, verdict.line()
    if verdict.envelope == 0:  # the case above (reference BLAS); elsewhere the bound already FAILs
        assert "a leak: node" in verdict.detail, verdict.line()
