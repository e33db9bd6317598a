"""The per-node state a tree verify keeps, for every recurrent family of mlx-lm:
the footprint treespec reports is the memory the kept states hold, and a
tree over the limit is refused before anything is written (the gated-delta
families' config-level table: suites/hybrid/test_footprint.py)."""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache, CacheList, make_prompt_cache

from suites.families import helpers as H
from suites.families import helpers_models as M
from treespec.audit.states import fingerprint
from treespec.errors import TreeRefused
from treespec.models import prefill
from treespec.tree import DraftTree
from treespec.verify import adapter_for
from treespec.verify.footprint import MAX_BYTES_ENV, footprint_breakdown
from treespec.verify.tree_recurrence import TreeRecurrence

pytestmark = pytest.mark.exactness

# Every module of mlx-lm 0.32.2 whose tiny model has an ArraysCache and
# verifies (the sweep's verdicts), one mixer kind after another.
RECURRENT = [
    "qwen3_5", "qwen3_5_moe", "qwen3_next", "prism_hadamard_qwen35", "olmo_hybrid",  # GatedDeltaNet
    "kimi_linear", "kimi_k3", "bailing_moe_v3",  # KDA
    "mamba", "jamba",  # Mamba
    "mamba2", "nemotron_h", "plamo2", "granitemoehybrid", "falcon_h1",  # Mamba2
    "lfm2", "lfm2-vl", "lfm2_moe", "gear",  # short convs
    "recurrent_gemma",  # RG-LRU
    "rwkv7",  # time and channel mixing sharing one cache
    "bailing_moe_linear", "bailing_hybrid",  # gated linear attention
    "longcat_flash_ngram",  # n-gram context
]


def has_arrays_cache(model) -> bool:
    return any(type(c) is ArraysCache or (type(c) is CacheList and any(
        type(s) is ArraysCache for s in c.caches)) for c in make_prompt_cache(model))


@pytest.mark.slow
def test_the_list_is_every_recurrent_family():
    """RECURRENT above is read off the models, not hoped for."""
    found = []
    for name in M.modules():
        if "@" in name or name in ("olmo", "muse_spark"):
            continue
        if has_arrays_cache(M.build(name)):
            found.append(name)
    assert sorted(found) == sorted(RECURRENT + ["baichuan_m1"])  # baichuan_m1: refused


@pytest.mark.slow
@pytest.mark.parametrize("name", RECURRENT)
def test_the_footprint_is_what_the_kept_states_hold_and_a_bigger_tree_is_refused(name, monkeypatch):
    model = M.build(name)
    cache = make_prompt_cache(model)
    prefill(model, cache, [3, 1, 4, 1, 5, 9, 2, 6])
    tree = DraftTree([7, 8, 9, 10, 11, 12, 13], H.PARENTS)
    need = footprint_breakdown(model, len(tree))["total_bytes"]
    assert need > 0
    before = fingerprint(cache)
    for strategy, env in ((TreeRecurrence(limit=need - 1), None), (TreeRecurrence(), need - 1)):
        if env is not None:
            monkeypatch.setenv(MAX_BYTES_ENV, str(env))
        adapter = adapter_for(model, recurrent=strategy)
        with pytest.raises(TreeRefused) as err:
            adapter.verify(tree, cache)
        assert f"{need} bytes" in str(err.value) and f"limit of {need - 1} bytes" in str(err.value)
        assert fingerprint(cache) == before, "a refused verify wrote into the cache"
    monkeypatch.delenv(MAX_BYTES_ENV)
    adapter = adapter_for(model, recurrent=TreeRecurrence(limit=need))
    mx.eval(adapter.verify(tree, cache))
    kept = adapter._last.captures.kept
    assert kept, "the verify kept no per-node states"
    assert sum(a.nbytes for _, states in kept for a in states.arrays()) == need
