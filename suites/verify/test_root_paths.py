"""Contract 6: every node's verify logits equal the last row of a plain mlx-lm
forward over that node's root path from the same cache state: bit for bit
where the backend is exact (the CPU reference BLAS), within its measured
envelope elsewhere, with the tree's own negative controls (flattened
positions, causal mask, a leaked sibling) landing far outside
(treespec.evidence.numerics; suites/helpers_numerics.py).

On a sliding-window ring (RotatingKVCache) the reference is classic
decoding's one-token steps over the root path (suites/verify/helpers.py,
``treespec.audit.states.classic``): a one-token step sees a wrapped ring's
keys in slot order, a multi-token forward in time order, and the verify
lays the ring out as the one-token steps see it (docs/verify.md#sliding-window-rings).
``test_the_root_row_is_the_one_token_step_at_every_ring_rotation`` pins
that, and that a time-ordered forward would be caught.
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
    History,
    assert_rows_are_root_path_forwards,
    clone,
    config_id,
    keys_rotated,
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
def test_the_root_row_is_the_one_token_step_at_every_ring_rotation(family):
    """The root of a tree is a one-token step; on a RotatingKVCache whose
    buffer has wrapped, that step hands the attention its keys in rotated
    order (``_update_in_place``), and the verify's root row equals it (bit
    for bit where the backend is exact, within the measured envelope
    elsewhere). Swept over prompts of 0..window+2 and 2*window+1 tokens,
    each followed by 0..window+2 single steps (every buffer rotation, both
    wrap routes). The control, on an exact backend: where the keys are
    rotated (float32), row 0 of a two-token forward (time-ordered keys)
    differs from the root row, so a verify that put the ring in time order
    would be caught here."""
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
                offset = n_prompt + n_steps
                check(step, logits[0], model, offset, (1, 3), VERIFY,
                      what="root row vs the one-token step")
                if rotated and mx.array_equal(step, logits[0]).item():
                    concat = plain_rows(model, clone(before), tree.tokens[:2])[0]
                    assert not mx.array_equal(concat, logits[0]).item(), (n_prompt, n_steps)
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
