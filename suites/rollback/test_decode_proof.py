"""The proof at the attentions for decoding on after a commit
(treespec.evidence.attention_rows.decode_proof): one-token steps from a
committed cache that differ from the same steps from the cache fed the path
one token at a time are proven where, taught the committed cache's attention
outputs step by step, the reference's steps give its logits bit for bit,
each attention's own output is within one unit in the last place (at the
row's scale) of the committed cache's, and the wrong-branch control (the path
with its first token replaced) moves an attention output 10x further.

A commit on a backend whose products depend on the call's width leaves the
path's rows as the n-wide verify computed them, a rounding away from the
one-token steps' rows: the committed cache here is the reference cache with
one element of its newest ring row moved by k steps of its bit pattern
(suites.planted.bit_steps), on gemma3_text bfloat16 over a wrapped ring.
Tried: with the outside check dropped, the recurrent-state test fails."""

import copy

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache, RotatingKVCache

from suites.planted import bit_steps
from suites.verify import helpers
from treespec.evidence.attention_rows import STALE, ULPS, decode_proof
from treespec.evidence.verdicts import SEPARATION

pytestmark = pytest.mark.exactness

PATH, LATER = [5, 9, 13], [[3], [7], [11]]  # LATER: three one-token steps
BRANCH = [6, 9, 13]  # the control: another first token, so every row of the path another branch's


def fed(model, cache, tokens):
    """A copy of ``cache`` after one-token steps over ``tokens``."""
    c = copy.deepcopy(cache)
    for t in tokens:
        model(mx.array([[t]]), cache=c)
    mx.eval([x.state for x in c])
    return c


def moved(cache, kind, what: str, k: int):
    """A copy of ``cache`` with one element of the first ``kind`` cache's
    newest row of ``what`` (its largest in head 0) moved by ``k`` bit steps."""
    c = copy.deepcopy(cache)
    entry = next(x for x in c if isinstance(x, kind))
    if kind is ArraysCache:
        state = entry.cache[-1]
        entry.cache[-1] = bit_steps(state, (0,) * state.ndim, k)
        return c
    arr = getattr(entry, what)
    slot = (entry._idx - 1) % entry.max_size
    at = int(mx.argmax(mx.abs(arr[0, 0, slot].astype(mx.float32))).item())
    setattr(entry, what, bit_steps(arr, (0, 0, slot, at), k))
    return c


@pytest.fixture(scope="module")
def ring():
    model = helpers.model("gemma3_text", "bfloat16")
    before = helpers.history(11).replay(model)
    assert any(isinstance(c, RotatingKVCache) and c.offset > c.max_size for c in before)
    return model, fed(model, before, PATH), fed(model, before, BRANCH)


@pytest.mark.parametrize("calls", [LATER, [sum(LATER, [])]], ids=["steps", "one-forward"])
@pytest.mark.parametrize("what", ["values", "keys"])
def test_one_unit_in_a_cached_row_is_proven_and_the_wrong_branch_lands_10x_beyond(ring, what, calls):
    # Later one-token steps (suites/ring), or one forward over them (the audit's chunks).
    model, ref, branch = ring
    proof, why = decode_proof(model, moved(ref, RotatingKVCache, what, 1), ref, calls, branch)
    assert proof is not None, why
    assert proof.max_ulps <= ULPS and proof.control >= SEPARATION * ULPS, proof
    assert STALE in proof.line()


@pytest.mark.parametrize("what", ["values", "keys"])
def test_more_than_one_unit_at_an_attention_proves_nothing(ring, what):
    model, ref, branch = ring
    proof, why = decode_proof(model, moved(ref, RotatingKVCache, what, 64), ref, LATER, branch)
    assert proof is None
    assert "units in the last place" in why and f"more than {ULPS:g}" in why, why


def test_the_same_path_is_not_a_control(ring):
    # A control that is no defect moves nothing: no proof can lean on it.
    model, ref, _ = ring
    proof, why = decode_proof(model, ref, ref, LATER, ref)
    assert proof is None
    assert why == f"the {STALE} control moved no attention output", why


def test_a_difference_outside_the_attentions_proves_nothing():
    # qwen3_5's recurrent state is read by its linear attention, which is not
    # taught: a moved state must show in the steps, not be proven.
    model = helpers.model("qwen3_5", "float32")
    before = helpers.history(9).replay(model)
    ref, branch = fed(model, before, PATH), fed(model, before, BRANCH)
    proof, why = decode_proof(model, moved(ref, ArraysCache, "", 1 << 12), ref, LATER, branch)
    assert proof is None
    assert why == "the steps differ outside the attentions too", why
