"""A linear tree verifies exactly as mlx-lm's own chain verify: the plain
``model(tokens[None], cache=cache)`` forward ``speculative_generate_step``
runs. Same logits bit for bit, and the caches end in the same state (every
array byte, every offset), on attention-only and hybrid recurrent models, on
every backend: it is that very forward.

Except on a sliding-window ring (RotatingKVCache): there a chain is laid
out as classic decoding's one-token steps see the ring (docs/verify.md#sliding-window-rings),
so its rows are those steps' (bit for bit where the backend is exact,
within its envelope elsewhere), not mlx-lm's multi-token forward's, which
puts a wrapped ring in time order."""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import RotatingKVCache

from suites.helpers_numerics import exact
from suites.verdict import CHAIN
from suites.verify import helpers
from suites.verify.helpers import (CONFIGS, KV_QUANT, assert_rows_are_root_path_forwards, clone,
                                   config_id, fingerprint, max_abs_diff, plain_rows)
from treespec.tree import DraftTree
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness


def _cases(ring: bool):
    """(config, history, tree) of every config whose caches have a
    sliding-window ring (``ring``) or have none."""
    for cfg in CONFIGS + KV_QUANT:
        if (helpers.window(cfg[0]) is not None) != ring:
            continue
        hists = helpers.histories(cfg[0], cfg[3] if len(cfg) > 3 else None)
        for hist in (hists[1], hists[3], hists[4]):  # short, wrapped by prompt, by steps
            for name, tree in helpers.linear_trees(cfg[0]).items():
                yield pytest.param(cfg[:3], hist, tree, id=f"{config_id(cfg)}-h{hist.offset}-{name}")


@pytest.mark.parametrize("cfg, hist, tree", list(_cases(ring=False)))
def test_a_linear_tree_verifies_exactly_as_mlx_lm_chain_verify(cfg, hist, tree):
    model = helpers.model(*cfg)
    cache = hist.replay(model)
    chain_cache = clone(cache)
    chain = plain_rows(model, chain_cache, tree.tokens)
    logits = adapter_for(model).verify(tree, cache)
    mx.eval(logits)
    assert mx.array_equal(chain, logits), max_abs_diff(chain, logits)
    assert fingerprint(cache) == fingerprint(chain_cache)
    exact(CHAIN, model, f"kv{hist.kv_bits}" if hist.kv_bits else "")


@pytest.mark.parametrize("cfg, hist, tree", list(_cases(ring=True)))
def test_a_linear_tree_on_a_ring_verifies_as_its_one_token_steps(cfg, hist, tree):
    """Short (not yet full), wrapped by a prompt and wrapped by single steps;
    chains up to longer than the window."""
    model = helpers.model(*cfg)
    cache = hist.replay(model)
    before = clone(cache)
    assert any(isinstance(c, RotatingKVCache) for c in cache)
    logits = adapter_for(model).verify(tree, cache)
    mx.eval(logits)
    assert_rows_are_root_path_forwards(model, before, tree, logits)


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_5"])
def test_a_chain_verified_on_device_tokens_equals_one_verified_on_its_tree(family):
    """The round loop verifies a chain on its drafts while they are still a
    lazy device array (draft.DeviceRound); only the topology is known then.
    Same logits, same caches, and the commit takes the tree once known."""
    model = helpers.model(family)
    cache = helpers.history(9).replay(model)
    lazy_cache = clone(cache)
    tree = DraftTree.linear([3, 17, 42, 8])
    adapter, lazy = adapter_for(model), adapter_for(model)
    want = adapter.verify(tree, cache)
    drafts = mx.argmax(mx.eye(64)[mx.array([17, 42, 8])], axis=-1)  # not evaluated yet
    tokens = mx.concatenate([mx.array([3], dtype=drafts.dtype), drafts])
    got = lazy.verify(DraftTree.linear([3] * 4), lazy_cache, tokens=tokens)
    assert mx.array_equal(want, got)
    adapter.commit(cache, tree, [0, 1])
    lazy.commit(lazy_cache, tree, [0, 1])
    assert fingerprint(cache) == fingerprint(lazy_cache)


def test_device_tokens_of_the_wrong_length_are_refused_before_any_write():
    model = helpers.model("llama")
    cache = helpers.history(6).replay(model)
    before = fingerprint(cache)
    with pytest.raises(ValueError, match="tokens has shape"):
        adapter_for(model).verify(DraftTree.linear([1, 2, 3]), cache, tokens=mx.array([1, 2]))
    assert fingerprint(cache) == before


def test_a_commit_of_another_topology_than_the_verify_is_refused():
    model = helpers.model("llama")
    cache = helpers.history(6).replay(model)
    adapter = adapter_for(model)
    adapter.verify(DraftTree.linear([1, 2, 3]), cache)
    with pytest.raises(ValueError, match="tree of the last verify"):
        adapter.commit(cache, DraftTree([1, 2, 3], [-1, 0, 0]), [0, 1])
