"""A head shares the target's embedding and output head (the same module
objects, not copies) and changes nothing in the target: after loading a head
and running it, every target array is the same object with the same bytes,
and none of the head's own parameters is a target array."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from suites.heads import helpers
from treespec.heads.load import load_head


@pytest.mark.parametrize("layout", sorted(helpers.LAYOUTS))
def test_a_head_shares_the_targets_embedding_and_head_and_changes_none_of_its_arrays(layout):
    """Fails with the head holding a copy of the embedding, tried."""
    model, path, spec = helpers.target_of(layout)
    text = getattr(model, "language_model", model)
    before = helpers.snapshot(model)
    head = load_head(spec, model, path)
    width = len(head.taps) * head.target_hidden_size
    tokens = mx.array([[3, 4, 5]])
    feats = mx.zeros((1, 3, width), dtype=text.model.embed_tokens.weight.dtype)
    logits, hidden = head(tokens, feats, head.make_cache())
    mx.eval(logits, hidden)

    assert head.shared.embed is text.model.embed_tokens
    after = helpers.snapshot(model)
    assert after.keys() == before.keys()
    for k in before:
        assert after[k][0] is before[k][0], k
        assert np.array_equal(after[k][1], before[k][1]), k
    target_ids = {id(v) for v, _ in before.values()}
    own = tree_flatten(head.parameters())
    assert own and not any(id(v) in target_ids for _, v in own)
    # What the head shares is not among what it trains or saves.
    assert not any("embed_tokens" in k and "embed_tokens" not in _own_names(spec) for k, _ in own)


def _own_names(spec):
    # An EAGLE-3 head keeps an embedding of its own only when its file has one.
    if spec == "mtp":
        return ""
    return " ".join(helpers.raw_tensors(spec))
