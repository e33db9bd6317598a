"""A reduced draft vocabulary maps back as ``target_id = draft_id +
d2t[draft_id]`` (EAGLE-3's convention, as speculators saves it: int64 d2t,
bool t2d), checked on a hand-made head whose target ids are known by
construction; every other target id gets -inf."""

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from treespec import zoo
from treespec.heads.eagle3 import Eagle3Head
from treespec.heads.load import load_head

# Target ids of draft ids 0..5, chosen: first, last, a run, a gap.
IDS = [0, 7, 8, 9, 200, zoo.VOCAB_SIZE - 1]
CONFIG = {
    "speculators_model_type": "eagle3",
    "transformer_layer_config": {"hidden_size": 64, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "head_dim": 16,
                                 "intermediate_size": 32, "vocab_size": zoo.VOCAB_SIZE},
    "draft_vocab_size": len(IDS),
    "target_hidden_size": 64,
    "eagle_aux_hidden_state_layer_ids": [1, 2, 2],
}


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory):
    """Written as a published head: config.json and model.safetensors."""
    model = zoo.build("llama")
    head = Eagle3Head.build(CONFIG, model)
    weights = {k: v for k, v in tree_flatten(head.parameters()) if k != "d2t"}
    # lm_head rows 0..5 pick hidden channel d: a hidden that is large in
    # channel d makes draft id d the argmax.
    weights["lm_head.weight"] = mx.eye(64)[: len(IDS)]
    weights["norm.weight"] = mx.ones((64,))
    # fc passes the first tap through: features decide the hidden.
    weights["fc.weight"] = mx.concatenate([mx.eye(64), mx.zeros((64, 128))], axis=1)
    weights["d2t"] = mx.array(IDS, dtype=mx.int64) - mx.arange(len(IDS), dtype=mx.int64)
    t2d = np.zeros(zoo.VOCAB_SIZE, dtype=bool)
    t2d[IDS] = True
    weights["t2d"] = mx.array(t2d)
    d = tmp_path_factory.mktemp("d2t") / "head"
    d.mkdir()
    mx.save_safetensors(str(d / "model.safetensors"), weights, metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(CONFIG))
    return d, model


def test_draft_logits_land_on_draft_id_plus_d2t_and_nowhere_else(head_dir):
    """Fails with target = draft - d2t, tried."""
    d, model = head_dir
    head = load_head(str(d), model, None)
    draft = mx.arange(1, len(IDS) + 1, dtype=mx.float32)[None, None]  # draft id d scores d + 1
    full = np.array(head.full_logits(draft))[0, 0]
    expected = np.full(zoo.VOCAB_SIZE, -np.inf, dtype=np.float32)
    expected[IDS] = np.arange(1, len(IDS) + 1)
    np.testing.assert_array_equal(full, expected)
    assert head.target_ids().tolist() == IDS


@pytest.mark.parametrize("draft_id", range(len(IDS)))
def test_the_heads_argmax_is_the_known_target_id(head_dir, draft_id):
    """Through the whole forward: features 100 * e_d pass through fc into the
    residual stream, which the layer's unit-scale attention and MLP cannot
    outweigh, and lm_head row d reads channel d: draft id d wins, so the
    head's argmax over the target's vocabulary is IDS[d]. Fails with
    target = draft - d2t, tried."""
    d, model = head_dir
    head = load_head(str(d), model, None)
    feats = mx.zeros((1, 1, 192))
    feats[0, 0, draft_id] = 100.0
    logits, _ = head(mx.array([[1]]), feats, None)
    row = np.array(logits[0, 0])
    assert int(row.argmax()) == IDS[draft_id]
    assert np.isinf(row).sum() == zoo.VOCAB_SIZE - len(IDS)
