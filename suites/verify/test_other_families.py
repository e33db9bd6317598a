"""mlx-lm families outside the zoo that share its attention pattern (mask from
``cache.make_mask``, positions from ``self.rope(x, offset=...)``) verify
exactly with no code of their own: tiny random float32 models, a branching
tree, histories before and after the window wraps. Between them they cover
the RoPE classes the zoo lacks (YarnRoPE, SuScaledRoPE, NoPE, traditional
rope) and a window on layers whose global neighbours call no rope."""

import mlx.core as mx
import pytest
from mlx_lm.utils import _get_classes

from suites.verify import helpers
from suites.verify.helpers import clone, assert_rows_are_root_path_forwards
from treespec.tree import DraftTree
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness

BASE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 128,
    "max_position_embeddings": 4096,
}

CONFIGS = {
    "mistral": {"rope_theta": 1e6, "rope_scaling": {"type": "yarn", "factor": 4.0,
                "original_max_position_embeddings": 1024}},
    "qwen2": {"rope_scaling": {"type": "linear", "factor": 2.0}},
    "phi3": {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8,
             "long_factor": [1.0 + 0.25 * i for i in range(8)]},
             "original_max_position_embeddings": 1024},
    "olmo2": {},
    "granite": {"logits_scaling": 2.0, "attention_multiplier": 0.2,
                "embedding_multiplier": 4.0, "residual_multiplier": 0.5,
                "rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False},
    "starcoder2": {"norm_epsilon": 1e-5},
    "smollm3": {"no_rope_layer_interval": 2},
    "cohere2": {"head_dim": 16, "sliding_window": 6, "sliding_window_pattern": 2,
                "layer_norm_eps": 1e-5},
}
ROPES = {"mistral": "YarnRoPE", "phi3": "SuScaledRoPE", "smollm3": "NoPE"}


def tiny(family):
    config = {"model_type": family, **BASE, **CONFIGS[family]}
    mx.random.seed(0)
    model_class, args_class = _get_classes(config=config)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_a_family_with_the_same_pattern_verifies_exactly(family):
    model = tiny(family)
    if family in ROPES:
        names = {type(m["rope"]).__name__ for _, m in model.named_modules() if "rope" in m}
        assert ROPES[family] in names
    adapter = adapter_for(model)
    assert adapter.family.record.startswith("audited"), adapter.family.record
    tree = DraftTree(helpers.tokens(10, 5), [-1, 0, 0, 1, 1, 3, 3, 4, 6, 2])
    tree = DraftTree([t % 128 for t in tree.tokens], tree.parents)
    for hist in (helpers.history(0), helpers.history(4), helpers.history(3, 9)):
        hist = type(hist)(tuple(t % 128 for t in hist.prompt), tuple(t % 128 for t in hist.steps))
        cache = hist.replay(model)
        before = clone(cache)
        assert_rows_are_root_path_forwards(model, before, tree, adapter.verify(tree, cache))
