"""Decoding on after a commit, against a reference at the verify's width
(treespec.evidence.same_width.padded_path): the accepted path fed padded to
the tree's n tokens, the padding trimmed by mlx-lm, so that the path's cache
rows are written by an n-row forward as the verify wrote them. Where the
backend's products depend on the call's width, the committed caches then
decode on bit for bit like that reference, though not like a cache fed the
path alone; a wrong row still differs and FAILs against the path-only cache.

The width dependence is planted on the zoo llama's key projections (each
key moved by EPS per extra token of the forward that wrote it), so the
committed caches (keys from the n-node verify) and the path-only cache (keys
from a |path|-token forward) hold other keys while every logit of a later
step is computed at the same width. Tried: with ``padded_path`` trimming one
row too few, the proof test fails (the later logits differ); with
``proven_at_width`` ignoring the reference, it fails too (no verdict)."""

import copy

import mlx.core as mx
import mlx.nn as nn
import pytest

from suites.helpers_numerics import judged
from suites.rollback.helpers_caches import BUSH
from suites.rollback.helpers_models import (
    classic,
    make_caches,
    model,
    prefill,
    proven_at_width,
    register,
    verify,
)
from treespec.evidence import numerics
from treespec.evidence.same_width import padded_path, position_reason
from treespec.rollback import commit_path, snapshot

pytestmark = pytest.mark.exactness

EPS = 1e-3
NAME = "llama+width-dependent-keys"
HISTORY = list(range(40, 60))
LATER = [[3], [7, 8]]
PATH = BUSH.path_to(4)  # [0, 1, 4]; node 3 is node 4's sibling


class WidthKeys(nn.Module):
    """A key projection whose output moves by ``eps`` per extra token of its call."""

    def __init__(self, inner, eps: float):
        super().__init__()
        self.inner, self.eps = inner, eps

    def __call__(self, x):
        return self.inner(x) + self.eps * (x.shape[1] - 1)


@pytest.fixture(scope="module")
def planted():
    m = copy.deepcopy(model("llama"))
    for layer in m.layers:
        layer.self_attn.k_proj = WidthKeys(layer.self_attn.k_proj, EPS)
    register(NAME, m)
    return m


def fresh():
    caches = make_caches(NAME, "native")
    prefill(NAME, "native", caches, HISTORY)
    return caches


def committed(commit):
    """Caches after verifying BUSH and committing the nodes ``commit``."""
    ours = fresh()
    snap = snapshot(ours)
    logits, captures = verify(NAME, BUSH, ours)
    mx.eval(logits)
    commit_path(ours, len(HISTORY), commit, BUSH, snapshot=snap, recurrent=captures)
    return ours


def decode(commit):
    """(committed, path-only, same-width) logits of each later chunk."""
    m = model(NAME)
    ours, ref = committed(commit), fresh()
    classic(m, [BUSH.tokens[i] for i in PATH], ref)
    same = padded_path(m, fresh(), BUSH, PATH)
    out = []
    for chunk in LATER:
        x = mx.array(chunk)[None]
        out.append(tuple(m(x, cache=c) for c in (ours, ref, same)))
    return out


def test_decoding_on_equal_to_the_path_fed_at_the_verify_width_is_proven(planted):
    why = position_reason(planted, len(BUSH))
    if why is not None:  # there the verify's rows and the padded forward's may differ
        pytest.skip(why)
    for a, b, s in decode(PATH):
        assert not mx.array_equal(a, b).item()  # the planted keys: other widths, other bits
        verdict = proven_at_width(a, b, s, "later logits")
        assert verdict is not None and verdict.word == numerics.BIT_EXACT
        assert "fed at each verify's width, bit for bit" in verdict.detail


def test_a_wrong_row_is_not_equal_to_the_same_width_reference_and_fails(planted):
    wrong = PATH[:-1] + [3]  # the sibling's row kept in the last slot
    for a, b, s in decode(wrong):
        assert proven_at_width(a, b, s, "later logits") is None
        verdict = judged(a, b, planted, len(HISTORY) + len(PATH), {1, 2, 3, len(BUSH)})
        assert verdict.word == numerics.FAIL, verdict.line()


@pytest.mark.parametrize("family, history", [("qwen3_5", 20), ("gemma3_text", 20)],
                         ids=["recurrent state", "ring without room"])
def test_no_reference_where_a_cache_cannot_drop_the_padding(family, history):
    m = model(family)
    caches = make_caches(family, "native")
    prefill(family, "native", caches, HISTORY[:history])
    assert padded_path(m, caches, BUSH, PATH) is None
    with pytest.raises(ValueError, match="root path"):
        padded_path(m, caches, BUSH, [0, 2, 4])
