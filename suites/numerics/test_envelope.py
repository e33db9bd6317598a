"""The instrument itself (treespec.numerics): the pass rule, the separation
rule, and that the envelope widens for what the backend does to multi-token
forwards but never for a tree-path defect.

Planted at the kernels mlx-lm calls, for the duration of one test and in
whatever regime the run is in (README's test command runs both CPU regimes):

- a multi-token-only matmul change of a few ulp raises the measured
  envelope (on the reference BLAS from 0), the tree verify is then "within
  envelope" and the gate declines: the right answer;
- a RoPE whose per-row (vector) offsets are off by one, and an attention
  that ignores an array mask over several queries, are tree-path defects:
  the envelope does not admit the tree path, and the tree verify FAILs.
"""

import mlx.core as mx
import mlx.nn as nn
import mlx_lm.models.llama as llama_module
import pytest
from mlx_lm.models.cache import make_prompt_cache

from suites.verify import helpers
from treespec import numerics, zoo
from treespec.audit.states import clone
from treespec.gate import decide, shapes_for
from treespec.tree import DraftTree
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness

TREE = DraftTree(helpers.tokens(9, 5), [-1, 0, 0, 1, 1, 2, 3, 3, 5])
CONTEXT = 6


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


# -- the measurement against planted kernels -------------------------------------


def _verify_and_judge(model, env):
    cache = helpers.history(CONTEXT).replay(model)
    before = clone(cache)
    logits = adapter_for(model).verify(TREE, cache)
    refs = mx.stack([helpers.plain_rows(model, clone(before), [TREE.tokens[j] for j in TREE.path_to(i)])[-1]
                     for i in range(len(TREE))])
    controls = numerics.controls(model, before, TREE, refs)
    return numerics.judge(logits, refs, env, controls)


def test_a_multi_token_matmul_change_of_a_few_ulp_widens_the_envelope_and_the_gate_declines(monkeypatch):
    model = zoo.build("llama")
    plain = numerics.measure(model, CONTEXT, numerics.widths_of(TREE))
    real = nn.Linear.__call__

    def few_ulp_more_for_several_rows(self, x):
        y = real(self, x)
        return y * (1 + 2.0 ** -21) if x.ndim >= 2 and x.shape[-2] > 1 else y

    monkeypatch.setattr(nn.Linear, "__call__", few_ulp_more_for_several_rows)
    env = numerics.measure(model, CONTEXT, numerics.widths_of(TREE))
    assert not env.exact and env.tree_ok, (plain.line(), env.line())
    verdict = _verify_and_judge(model, env)
    if plain.exact:  # the reference BLAS: raised from 0, and the verify is within it
        assert verdict.word == numerics.WITHIN, verdict.line()
    else:  # a backend already inexact: never a FAIL for a few ulp
        assert verdict.ok and verdict.word != numerics.BIT_EXACT, verdict.line()
    decision = decide(model, shapes_for(4, [TREE.parents]), draws=1,
                      adapter_name="planted multi-token matmul")
    assert not decision.run and "declined" in decision.reason


def test_a_rope_with_per_row_offsets_off_by_one_fails(monkeypatch):
    model = zoo.build("llama")
    real = mx.fast.rope

    def shifted(x, *args, offset, **kwargs):
        if isinstance(offset, mx.array) and offset.ndim == 1:
            offset = offset + 1
        return real(x, *args, offset=offset, **kwargs)

    monkeypatch.setattr(mx.fast, "rope", shifted)
    env = numerics.measure(model, CONTEXT, numerics.widths_of(TREE))
    assert not env.tree_ok, env.line()
    verdict = _verify_and_judge(model, env)
    assert verdict.word == numerics.FAIL and verdict.max_diff > 1e-3, verdict.line()


def test_an_attention_that_ignores_an_array_mask_over_several_queries_fails(monkeypatch):
    model = zoo.build("llama")
    real = llama_module.scaled_dot_product_attention

    def maskless(queries, keys, values, cache, scale, mask, **kwargs):
        if isinstance(mask, mx.array) and queries.shape[2] > 1:
            mask = None
        return real(queries, keys, values, cache=cache, scale=scale, mask=mask, **kwargs)

    monkeypatch.setattr(llama_module, "scaled_dot_product_attention", maskless)
    env = numerics.measure(model, CONTEXT, numerics.widths_of(TREE))
    assert not env.tree_ok, env.line()
    verdict = _verify_and_judge(model, env)
    assert verdict.word == numerics.FAIL and verdict.max_diff > 1e-3, verdict.line()
