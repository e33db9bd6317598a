"""treespec.bench.scaled: the random ~1B pair of the throughput study. Its drafter
must be exactly the target's first layers (the claim that makes its
acceptance a drafter's), and alpha must touch only the layers it lacks."""

import mlx.core as mx
import pytest

from treespec.bench import scaled
from treespec.auto.costcurve import build_llama


def test_the_drafter_is_the_targets_first_layers():
    target, draft = scaled.build_pair(128, 4, 2, 0.3, dtype="float32")
    x = mx.array([[1, 5, 9, 200, 31999]])
    h = target.model.embed_tokens(x)
    for layer in target.model.layers[:2]:  # by hand, from the target's own modules
        h = layer(h, "causal", None)
    want = target.lm_head(target.model.norm(h))
    assert mx.array_equal(draft(x), want)


def test_alpha_damps_only_what_the_layers_past_the_drafter_write():
    plain = build_llama(128, 4, dtype="float32", seed=0, tied=False)
    target, _ = scaled.build_pair(128, 4, 2, 0.25, dtype="float32")
    for i, (got, ref) in enumerate(zip(target.model.layers, plain.model.layers)):
        scale = 0.25 if i >= 2 else 1.0
        assert mx.array_equal(got.self_attn.o_proj.weight, ref.self_attn.o_proj.weight * scale)
        assert mx.array_equal(got.mlp.down_proj.weight, ref.mlp.down_proj.weight * scale)
        assert mx.array_equal(got.self_attn.q_proj.weight, ref.self_attn.q_proj.weight)
        assert mx.array_equal(got.mlp.up_proj.weight, ref.mlp.up_proj.weight)


def test_the_target_has_a_head_of_its_own():
    # Tied, a random model's greedy text is one token repeated (scaled.py).
    target, _ = scaled.build_pair(128, 4, 2, 0.3, dtype="float32")
    assert "lm_head" in dict(target.children())


@pytest.mark.parametrize("kw, words", [(dict(draft_layers=4), "draft_layers"),
                                       (dict(draft_layers=0), "draft_layers"),
                                       (dict(alpha=0.0), "alpha"), (dict(alpha=1.5), "alpha")])
def test_bad_sizes_are_refused(kw, words):
    args = dict(hidden=128, layers=4, draft_layers=2, alpha=0.3, dtype="float32") | kw
    with pytest.raises(ValueError, match=words):
        scaled.build_pair(**args)


def test_agreement_is_one_for_a_drafter_that_is_the_target():
    """The measurement itself: fed the target's own greedy text, the target
    predicts every token of it."""
    target, _ = scaled.build_pair(128, 4, 2, 0.3, dtype="float32")
    assert scaled.agreement(target, target, scaled.default_prompts(2, length=8), 8) == 1.0
