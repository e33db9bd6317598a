"""Contract 6: every node's verify logits equal the last row of a plain mlx-lm
forward over that node's root path from the same cache state: bit for bit
where the backend is exact (the CPU reference BLAS), within its measured
envelope elsewhere, with the tree's own negative controls (flattened
positions, causal mask, a leaked sibling) landing far outside
(treespec.numerics; suites/helpers_numerics.py).

The one place a plain forward differs is pinned, not tolerated: a root-only
path is a one-token step, and on a RotatingKVCache whose buffer has wrapped
that step attends over its keys in rotated order (``_update_in_place``),
while every multi-token forward (the tree's, and any longer path's) gets
them time-ordered (``_update_concat``). See
``test_a_one_token_step_on_a_wrapped_window_differs_only_by_key_order``.
"""

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suites import helpers_strategies as strategies
from suites.helpers_numerics import check
from suites.verdict import VERIFY
from suites.verify import helpers
from suites.verify.helpers import (
    CONFIGS,
    HYBRID,
    KV_QUANT,
    REORDER_BOUND,
    History,
    assert_rows_are_root_path_forwards,
    clone,
    config_id,
    keys_rotated,
    max_abs_diff,
    plain_rows,
)
from treespec import zoo
from treespec.tree import DraftTree
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness

def verify_against_root_paths(family, dtype, bits, hist: History, tree: DraftTree):
    model = helpers.model(family, dtype, bits)
    cache = hist.replay(model)
    before = clone(cache)
    logits = adapter_for(model).verify(tree, cache)
    mx.eval(logits)
    assert logits.shape == (len(tree), zoo.VOCAB_SIZE)
    kv = (hist.kv_bits, helpers.KV_GROUP) if hist.kv_bits else None
    assert_rows_are_root_path_forwards(model, before, tree, logits, kv)


def _cases():
    for cfg in CONFIGS + KV_QUANT:
        family, kv_bits = cfg[0], (cfg[3] if len(cfg) > 3 else None)
        trees = (
            helpers.linear_trees(family)
            if family in HYBRID
            else {**helpers.branching_trees(family), "chain-5": helpers.linear_trees(family)["chain-5"]}
        )
        for hist in helpers.histories(family, kv_bits):
            for name, tree in trees.items():
                yield pytest.param(
                    cfg[:3], hist, tree,
                    id=f"{config_id(cfg)}-h{hist.offset}{'s' if hist.steps else ''}-{name}",
                )


@pytest.mark.parametrize("cfg, hist, tree", list(_cases()))
def test_every_node_sees_what_a_plain_forward_over_its_root_path_sees(cfg, hist, tree):
    verify_against_root_paths(*cfg, hist, tree)


@pytest.mark.parametrize("family", ["gemma3_text", "gemma4_text"])
def test_a_one_token_step_on_a_wrapped_window_differs_only_by_key_order(family):
    """The exact condition: a one-token plain step gives the root bit-identical
    logits to the tree iff its RotatingKVCache hands the keys in time order,
    i.e. the buffer has not wrapped, or the step wrote its last slot. When
    rotated it differs (float32: every such state measured differs; in
    bfloat16/float16 the rounding of the logits absorbs it, measured equal
    in every state), and the tree's root row is exactly row 0 of a
    multi-token forward. Swept over prompts of 0..window+2 and 2*window+1
    tokens, each followed by 0..window+2 single steps (every buffer rotation,
    both wrap routes). Where the backend is not exact, the one-token step,
    the two-token forward and the tree are forwards of different widths: the
    same comparisons hold within the measured envelope (and the rotated
    step within the key-order bound)."""
    model = helpers.model(family)
    adapter = adapter_for(model)
    w = helpers.window(family)
    tree = DraftTree(helpers.tokens(3, 11), [-1, 0, 0])
    seen = {True: 0, False: 0}
    for n_prompt in sorted(set(range(0, w + 3)) | {2 * w + 1}):
        hist = helpers.history(n_prompt, w + 2, seed=n_prompt)
        cache = History(hist.prompt).replay(model)
        for n_steps, step_token in enumerate(hist.steps + (None,)):
            if n_prompt + n_steps:
                before = clone(cache)
                logits = adapter.verify(tree, clone(before))
                step_cache = clone(before)
                step = plain_rows(model, step_cache, tree.tokens[:1])[0]
                rotated = keys_rotated(step_cache)
                seen[rotated] += 1
                concat = plain_rows(model, clone(before), tree.tokens[:2])[0]
                offset = n_prompt + n_steps
                check(concat, logits[0], model, offset, (1, 2, 3), VERIFY,
                      what="root row vs a two-token forward")
                if rotated:  # float32: the ring order shows, within its bound
                    assert not mx.array_equal(step, logits[0]).item(), (n_prompt, n_steps)
                    assert max_abs_diff(step, logits[0]) <= REORDER_BOUND, (n_prompt, n_steps)
                else:
                    check(step, logits[0], model, offset, (1, 3), VERIFY,
                          what="root row vs the one-token step, keys in time order")
            if step_token is not None:
                plain_rows(model, cache, [step_token])  # one more single step
    assert seen[True] and seen[False]


@st.composite
def cases(draw, family):
    w = helpers.window(family) or 8
    n_prompt = draw(st.integers(0, 2 * w + 2))
    n_steps = draw(st.integers(0, w + 2))
    seed = draw(st.integers(0, 10_000))
    if family in HYBRID:
        tree = draw(strategies.linear_trees(max_nodes=12))
    else:
        tree = draw(strategies.trees(max_nodes=14))
    return helpers.history(n_prompt, n_steps, seed), tree


@pytest.mark.parametrize(
    "cfg", [c for c in CONFIGS if c[1] == "float32" and not c[2]] + [("llama", "bfloat16", 4)],
    ids=config_id,
)
@given(data=st.data())
@settings(max_examples=25, deadline=None)
def test_random_trees_at_random_offsets_match_root_path_forwards(cfg, data):
    hist, tree = data.draw(cases(cfg[0]))
    verify_against_root_paths(*cfg, hist, tree)
