"""Memory bound of the tree-aware recurrence: per-node states cost
4 Hv Dv Dk bytes (float32 recurrent state) plus the conv windows, per node
and per recurrent layer. Trees over the limit are refused before anything is
written, and the refusal says how big, what limit, and how to raise it.
(Every other mixer's footprint: suites/families/test_footprints.py.)"""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache

from suites.hybrid import helpers as H
from treespec import zoo
from treespec.errors import TreeRefused
from treespec.tree import DraftTree
from treespec.verify import adapter_for, register_recurrent
from treespec.verify import strategy as rec
from treespec.verify.footprint import (
    DEFAULT_MAX_TREE_STATE_BYTES,
    MAX_BYTES_ENV,
    _parse_bytes,
    check_tree_footprint,
    footprint_breakdown,
    state_footprint,
)
from treespec.mixers import discover
from treespec.verify.tree_recurrence import TreeMixer, TreeRecurrence, tree_recurrence

pytestmark = pytest.mark.exactness

# Qwen3.5-27B text config (Qwen/Qwen3.5-27B config.json, text_config; the
# same values as the Qwen3.6-27B model card: hidden 5120, 64 layers laid out
# 16 x (3 GatedDeltaNet + 1 gated attention), linear heads V 48 / QK 16, head
# dim 128), bf16 activations.
QWEN35_27B = {
    "model_type": "qwen3_5",
    "text_config": {
        "model_type": "qwen3_5_text",
        "dtype": "bfloat16",
        "hidden_size": 5120,
        "num_hidden_layers": 64,
        "full_attention_interval": 4,
        "linear_num_value_heads": 48,
        "linear_num_key_heads": 16,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    },
}

MiB = 1024**2


def test_qwen35_27b_footprint_table():
    info = footprint_breakdown(QWEN35_27B, 1)
    assert info["recurrent_layers"] == 48  # 48 of 64 layers are recurrent
    assert info["recurrent_bytes_per_node"] == 48 * 4 * 48 * 128 * 128  # 144 MiB
    assert info["recurrent_bytes_per_node"] == 144 * MiB
    # conv windows: (K-1) x (2 Hk Dk + Hv Dv) bf16 per layer, 60 KiB
    assert info["conv_bytes_per_node"] == 48 * 3 * (2 * 16 * 128 + 48 * 128) * 2
    table = {n: state_footprint(QWEN35_27B, n) for n in (8, 16, 64)}
    assert table == {8: 1_231_552_512, 16: 2_463_105_024, 64: 9_852_420_096}
    # with the default 2 GiB limit, 8 nodes pass and 16 are refused
    assert check_tree_footprint(QWEN35_27B, 8, DEFAULT_MAX_TREE_STATE_BYTES) == table[8]
    with pytest.raises(TreeRefused):
        check_tree_footprint(QWEN35_27B, 16, DEFAULT_MAX_TREE_STATE_BYTES)


def test_the_config_and_the_model_agree():
    for fam in H.FAMILIES:
        model = H.build(fam)
        assert footprint_breakdown(model, 5) == footprint_breakdown(zoo.config(fam), 5)


def test_limit_from_the_environment(monkeypatch):
    monkeypatch.setenv(MAX_BYTES_ENV, "3GiB")
    assert check_tree_footprint(QWEN35_27B, 16) == 2_463_105_024
    monkeypatch.setenv(MAX_BYTES_ENV, "2147483648")
    with pytest.raises(TreeRefused, match=MAX_BYTES_ENV):
        check_tree_footprint(QWEN35_27B, 16)
    assert _parse_bytes("512M") == 512 * MiB and _parse_bytes("2gib") == 2 * 1024**3


def _state(model, cache):
    """Identity of every array and every scalar a verify could write."""
    out = []
    for c in cache:
        if isinstance(c, ArraysCache):
            out.append(("arrays", tuple(id(a) for a in c.cache), c.left_padding, c.lengths))
        else:
            out.append(("kv", id(c.keys), id(c.values), c.offset))
    mixers = tuple(id(m.current()) for m in discover(model).mixers)
    return out, mixers


@pytest.mark.parametrize("family", H.FAMILIES)
@pytest.mark.parametrize("how", ["limit", "env"])
def test_refusal_fires_before_anything_is_written(family, how, monkeypatch):
    model = H.build(family)
    cache = H.prefill(model, [3, 1, 4, 1, 5])
    snap = H.snapshot(cache)
    tree = DraftTree([9, 2, 6, 5, 3], [-1, 0, 0, 1, 1])
    need = footprint_breakdown(model, len(tree))["total_bytes"]
    if how == "env":
        monkeypatch.setenv(MAX_BYTES_ENV, str(need - 1))
        strategy = TreeRecurrence()
    else:
        strategy = TreeRecurrence(limit=need - 1)
    before = _state(model, cache)
    with pytest.raises(TreeRefused) as err:
        H.verify(model, tree, cache, strategy)
    msg = str(err.value)
    assert f"{need} bytes" in msg and f"limit of {need - 1} bytes" in msg and MAX_BYTES_ENV in msg
    assert _state(model, cache) == before
    for a, b in zip(cache, snap):
        assert H.same_arrays_cache(a, b) if isinstance(a, ArraysCache) else H.same_kv(a, b)
    assert strategy._last is None
    # exactly at the limit it runs
    strategy = TreeRecurrence(limit=need)
    H.verify(model, tree, cache, strategy)


def test_tree_recurrence_refuses_and_restores():
    model = H.build("qwen3_5")
    cache = H.prefill(model, [1, 2])
    tree = DraftTree([1, 2, 3], [-1, 0, 0])
    before = _state(model, cache)
    found = discover(model)
    with pytest.raises(TreeRefused):
        with tree_recurrence(model, tree, cache, limit=1):
            pass
    assert _state(model, cache) == before
    # an error inside the block still puts the original mixers back
    with pytest.raises(RuntimeError):
        with tree_recurrence(model, tree, cache):
            assert found.mixers and all(isinstance(m.current(), TreeMixer) for m in found.mixers)
            raise RuntimeError("boom")
    assert _state(model, cache) == before


def test_a_registered_factory_gives_each_adapter_its_own_strategy():
    saved = rec._RECURRENT[rec.TREE]
    made = []

    def factory():
        made.append(TreeRecurrence())
        return made[-1]

    try:
        register_recurrent(rec.TREE, factory)
        model = H.build("qwen3_5")
        a, b = adapter_for(model), adapter_for(model)
        assert (a.recurrent, b.recurrent) == (made[0], made[1]) and made[0] is not made[1]
        cache = H.prefill(model, [7, 7])
        tree = DraftTree([1, 2, 3], [-1, 0, 0])
        mx.eval(a.verify(tree, cache))
        assert made[0]._last is None, "the verify handed its kept states to the commit"
        a.commit(cache, tree, [0, 2])
        # A strategy object would be shared by every adapter: refused.
        with pytest.raises(TypeError, match="factory"):
            register_recurrent(rec.TREE, TreeRecurrence())
    finally:
        rec._RECURRENT[rec.TREE] = saved
