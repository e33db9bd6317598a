"""Contract 8 for verify: what cannot be tree-verified is refused with a
TreeRefused naming the model family and the reason, before anything is
written: every cache compares equal (every array byte, every offset, every
attribute) before and after."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import (
    ChunkedKVCache,
    ConcatenateKVCache,
    RotatingKVCache,
    make_prompt_cache,
)
from mlx_lm.models import llama
from mlx_lm.models.rope_utils import DynamicNTKScalingRoPE

from suites.verify import helpers
from suites.verify.helpers import (HYBRID, assert_refused_untouched,
                                   assert_rows_are_root_path_forwards, clone)
from treespec import zoo
from treespec.decoding import decode
from treespec.tree import DraftTree
from treespec.verify import ChainOnly, TreeRefused, adapter_for

pytestmark = pytest.mark.exactness

BRANCHING = DraftTree([5, 6, 7, 8], [-1, 0, 0, 1])


def test_tree_refused_is_a_value_error():
    assert issubclass(TreeRefused, ValueError)


@pytest.mark.parametrize("family", HYBRID)
@pytest.mark.parametrize("offset", [0, 5])
def test_a_branching_tree_through_a_chain_only_recurrence_is_refused_and_caches_unchanged(
    family, offset
):
    # The default for gated-delta layers is the tree-aware recurrence
    # (suites/hybrid); a recurrence without one must refuse, never flatten.
    model = helpers.model(family)
    cache = helpers.history(offset).replay(model)
    adapter = adapter_for(model, recurrent=ChainOnly("GatedDeltaNet"))
    adapter.check(DraftTree.linear([1, 2, 3]), cache)  # chains are fine
    err = assert_refused_untouched(adapter, BRANCHING, cache, "GatedDeltaNet", "branching")
    assert err.family == family


def fresh_llama():
    # Not the lru-cached model: these tests swap a rope on the instance.
    return zoo.build("llama")


class HomemadeRoPE(nn.Module):
    def __call__(self, x, offset=0):
        return mx.fast.rope(x, x.shape[-1], traditional=False, base=1e4, scale=1.0, offset=offset)


@pytest.mark.parametrize(
    "rope, words",
    [
        (DynamicNTKScalingRoPE(16, 2048, False, 10000.0, 2.0), ("DynamicNTKScalingRoPE", "offset")),
        (HomemadeRoPE(), ("HomemadeRoPE", "not a RoPE class known")),
    ],
    ids=["dynamic-ntk", "unknown-class"],
)
def test_an_unsupported_rope_is_refused_and_caches_unchanged(rope, words):
    model = fresh_llama()
    adapter = adapter_for(model)
    cache = helpers.history(6).replay(model)
    model.model.layers[1].self_attn.rope = rope
    assert_refused_untouched(adapter, BRANCHING, cache, "layers.1.self_attn.rope", *words)
    # adapter_for refuses it up front too
    with pytest.raises(TreeRefused, match=words[0]):
        adapter_for(model)


class FlatPositionAttention(llama.Attention):
    """A user's attention that scales its queries by the position it reads off
    the cache (offset + arange(L)): over a flattened tree node i would get
    offset + i, its root path gives offset + depth."""

    def __call__(self, x, mask=None, cache=None):
        offset = cache.offset if cache is not None else 0
        scale = 1.0 + 0.01 * (mx.arange(x.shape[1]) + offset)[:, None].astype(x.dtype)
        return super().__call__(x * scale, mask, cache)


class UserModel(llama.Model):
    """A model class outside mlx-lm: the same llama, under another name."""


def test_position_arithmetic_outside_the_ropes_is_refused_naming_the_function():
    model = fresh_llama()
    for layer in model.model.layers:
        layer.self_attn.__class__ = FlatPositionAttention
    with pytest.raises(TreeRefused) as err:
        adapter_for(model)
    assert "FlatPositionAttention.__call__" in err.value.reason
    assert "arange" in err.value.reason and "flattened" in err.value.reason


def test_a_model_without_an_audit_record_is_accepted_and_says_so():
    """No list of names: a model class treespec has never seen is accepted by
    its structure, verifies exactly, and its diagnostics say it has no
    audit record."""
    base = fresh_llama()
    model = UserModel(base.args)
    model.update(base.parameters())
    adapter = adapter_for(model)
    assert adapter.family.record == "structurally accepted, no audit record"
    assert "no audit record" in repr(adapter) and "no audit record" in adapter.note
    cache = helpers.history(6).replay(model)
    before = clone(cache)
    assert_rows_are_root_path_forwards(model, before, BRANCHING, adapter.verify(BRANCHING, cache))
    assert adapter_for(base).note is None  # the zoo's llama has one
    notes = decode(model, [1, 2, 3], mode="tree", draft_model=model, budget=3,
                   max_tokens=4).stats.notes
    assert any("no audit record" in n for n in notes), notes


def test_a_wrapped_rotating_cache_with_kept_tokens_verifies_as_one_token_steps():
    """What make_prompt_cache(max_kv_size=8) gives a model without its own
    make_cache: RotatingKVCache(keep=4). Once wrapped a one-token step sees
    the kept keys 0..3 and a recent run in slot order, which every
    multi-token forward (mlx-lm's own chain verify too) does not (it drops
    the kept keys for later queries: logits differ by up to 3.9). The verify
    lays the ring out as the one-token steps see it, kept slots included:
    every node equals its root path's one-token steps, before and after the
    wrap (suites/ring pins every phase)."""
    model = helpers.model("llama")
    adapter = adapter_for(model)
    kept_cache = lambda: [RotatingKVCache(max_size=8, keep=4) for _ in model.layers]
    for prompt in (helpers.history(5).prompt, helpers.tokens(12, 3)):
        cache = kept_cache()
        mx.eval(model(mx.array(prompt)[None], cache=cache))
        before = clone(cache)
        assert_rows_are_root_path_forwards(model, before, BRANCHING, adapter.verify(BRANCHING, cache))


def test_kept_slots_under_a_window_narrower_than_the_ring_are_refused():
    """A ring with kept slots (keep > 0) whose model asks for a narrower
    window: mlx-lm's one-token mask then rolls over every slot, the kept
    ones too, which no layout reproduces for certain: refused by name,
    before anything is written."""
    model = helpers.model("gemma3_text")
    w = helpers.window("gemma3_text")
    cache = [RotatingKVCache(max_size=2 * w, keep=4) if isinstance(c, RotatingKVCache) else c
             for c in model.make_cache()]
    mx.eval(model(mx.array(helpers.tokens(3 * w, 5))[None], cache=cache))
    assert_refused_untouched(adapter_for(model), BRANCHING, cache, "keep=4",
                             f"narrower window {w}")


def test_rings_in_different_states_are_refused():
    """A model builds one mask per kind of layer from one of its caches; a
    verify lays every ring out with one mask, so rings of different sizes
    (gemma's own sliding windows and, here, its global layers on a wider
    ring) are refused by name, before anything is written."""
    model = helpers.model("gemma3_text")
    w = helpers.window("gemma3_text")
    cache = [c if isinstance(c, RotatingKVCache) else RotatingKVCache(max_size=w + 4)
             for c in model.make_cache()]
    mx.eval(model(mx.array(helpers.tokens(2 * w, 6))[None], cache=cache))
    assert_refused_untouched(adapter_for(model), BRANCHING, cache, "2 different ring states")


def test_an_unknown_cache_type_is_refused():
    model = helpers.model("llama")
    cache = [ChunkedKVCache(chunk_size=8) for _ in model.layers]
    assert_refused_untouched(adapter_for(model), BRANCHING, cache, "ChunkedKVCache")


def test_a_concatenate_cache_with_a_trimmed_tail_is_refused():
    model = helpers.model("llama")
    cache = [ConcatenateKVCache() for _ in model.layers]
    mx.eval(model(mx.array(helpers.tokens(6, 1))[None], cache=cache))
    adapter = adapter_for(model)
    before = clone(cache)
    assert_rows_are_root_path_forwards(model, before, BRANCHING, adapter.verify(BRANCHING, cache))
    for c in cache:
        c.trim(len(BRANCHING))
    assert_refused_untouched(adapter, BRANCHING, cache, "stale tail")


def test_a_batched_cache_is_refused():
    model = helpers.model("llama")
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([helpers.tokens(4, 1), helpers.tokens(4, 2)]), cache=cache))
    assert_refused_untouched(adapter_for(model), BRANCHING, cache, "batch of 2")


def test_caches_that_disagree_on_their_offset_are_refused():
    model = helpers.model("llama")
    cache = helpers.history(6).replay(model)
    cache[1].offset -= 1
    assert_refused_untouched(adapter_for(model), BRANCHING, cache, "disagree", "[5, 6]")
