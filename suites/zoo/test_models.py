"""The zoo's models: what the suites rely on, pinned here. The weights are a
pure function of (family, seed), identical on every machine; each family
hands mlx-lm the cache types of the real architecture; logits are varied,
not degenerate; unknown or unrunnable variants are refused with the reason;
and the envelope sees what a multi-token forward does."""

import hashlib

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

from suites.helpers_numerics import exact_backend
from suites.zoo.helpers import REQUIRED, prefill_then_step, random_tokens
from treespec.evidence import numerics
from treespec import zoo


pytestmark = pytest.mark.exactness

# What each architecture must hand mlx-lm, written from the model cards (not
# read from zoo): "kv" KVCache, "rotN" RotatingKVCache with a window of N,
# "arrays" the GatedDeltaNet's ArraysCache.
EXPECTED_CACHES = {
    "llama": ["kv", "kv"],
    "qwen3": ["kv", "kv"],
    "gemma3_text": ["rot8", "rot8", "kv", "rot8"],
    "gemma4_text": ["rot16", "kv", "rot16", "kv"],
    "qwen3_5": ["arrays", "arrays", "arrays", "kv"],
    "qwen3_next": ["arrays", "kv", "arrays", "kv"],
}

# sha256 (first 16 hex) over the sorted (name, float32 bytes) of build(f).
# Recomputed on any machine, these must not change: the weights are meant to
# be identical everywhere. If a deliberate change moves them, bump
# zoo.VERSION and update this table.
WEIGHT_HASHES = {
    "llama": "fb6ebb50e794cf91",
    "qwen3": "a4d6531e333fae2f",
    "gemma3_text": "8f97314dec5347b0",
    "gemma4_text": "13237a144b133991",
    "qwen3_5": "c8cc2ad8a8450232",
    "qwen3_next": "1bee3a1e7f9b5ae4",
}


def cache_kind(c):
    if isinstance(c, RotatingKVCache):
        return f"rot{c.max_size}"
    if isinstance(c, KVCache):
        return "kv"
    if isinstance(c, ArraysCache):
        return "arrays"
    return type(c).__name__


def weight_hash(model):
    h = hashlib.sha256()
    for name, value in sorted(tree_flatten(model.parameters())):
        h.update(name.encode())
        h.update(np.array(value).tobytes())
    return h.hexdigest()[:16]


def test_the_zoo_has_every_required_family():
    assert set(REQUIRED) <= set(zoo.FAMILIES)
    for family in zoo.FAMILIES:
        assert zoo.config(family)["model_type"] == family


@pytest.mark.parametrize("family", REQUIRED)
def test_build_is_deterministic_across_calls(family):
    first = dict(tree_flatten(zoo.build(family).parameters()))
    # Disturb every global RNG the build could lean on.
    mx.random.seed(987)
    mx.eval(mx.random.normal((17,)))
    np.random.seed(123)
    np.random.rand(5)
    second = dict(tree_flatten(zoo.build(family).parameters()))
    assert first.keys() == second.keys()
    for name in first:
        assert mx.array_equal(first[name], second[name]), name


@pytest.mark.parametrize("family", REQUIRED)
def test_a_different_seed_gives_different_weights(family):
    a = dict(tree_flatten(zoo.build(family, seed=0).parameters()))
    b = dict(tree_flatten(zoo.build(family, seed=1).parameters()))
    same = [n for n in a if a[n].ndim >= 2 and mx.array_equal(a[n], b[n])]
    assert same == []


@pytest.mark.parametrize("family", REQUIRED)
def test_weights_are_identical_on_every_machine(family):
    assert weight_hash(zoo.build(family)) == WEIGHT_HASHES[family]


@pytest.mark.parametrize("family", REQUIRED)
def test_each_family_gets_the_cache_types_it_claims(family):
    model = zoo.build(family)
    cache = make_prompt_cache(model)
    assert [cache_kind(c) for c in cache] == EXPECTED_CACHES[family]
    assert len(cache) == len(model.layers)
    # The sliding layers start writing over their oldest slot, keep none.
    assert all(c.keep == 0 for c in cache if isinstance(c, RotatingKVCache))


@pytest.mark.parametrize("family", REQUIRED)
def test_each_family_runs_a_cached_forward_of_the_right_shape(family):
    model = zoo.build(family)
    tokens = random_tokens(0, (2, 9))
    first, step = prefill_then_step(model, tokens, 8)
    assert first.shape == (2, 8, zoo.VOCAB_SIZE)
    assert step.shape == (2, 1, zoo.VOCAB_SIZE)
    assert mx.all(mx.isfinite(first)).item() and mx.all(mx.isfinite(step)).item()


def test_a_variant_the_cpu_cannot_run_is_refused_with_the_reason():
    if mx.default_device() != mx.cpu:
        pytest.skip("the refusal only applies on the CPU backend")
    with pytest.raises(ValueError, match="gather_mm"):
        zoo.build("qwen3_next", "bfloat16")
    zoo.build("qwen3_next", "bfloat16", bits=4)  # quantized experts are fine


@pytest.mark.parametrize(
    "kwargs",
    [
        {"family": "gpt9"},
        {"family": "llama", "dtype": "float64"},
        {"family": "llama", "bits": 7},  # mx.quantize takes 2, 3, 4, 5, 6 or 8
    ],
)
def test_an_unknown_family_dtype_or_bits_is_refused(kwargs):
    with pytest.raises(ValueError):
        zoo.build(**kwargs)


@pytest.mark.parametrize("family", REQUIRED)
def test_logits_are_varied_not_degenerate(family):
    model = zoo.build(family)
    tokens = random_tokens(2, (16, 16))
    logits = model(tokens)
    top = np.array(logits.argmax(-1))
    # Many different greedy tokens, rarely just the input token echoed.
    assert len(np.unique(top)) >= 0.4 * top.size
    assert (top == np.array(tokens)).mean() < 0.2
    # The greedy token depends on the context, not only on the last token.
    other = np.array(tokens)
    other[:, :-1] = np.random.RandomState(3).randint(0, zoo.VOCAB_SIZE, (16, 15))
    top_other = np.array(model(mx.array(other))[:, -1].argmax(-1))
    assert (top_other != top[:, -1]).mean() >= 0.5
    # Peaked enough to look like a language model, far from uniform.
    probs = mx.softmax(logits, axis=-1)
    assert 0.15 < probs.max(-1).mean().item() < 0.9


@pytest.mark.parametrize("family", REQUIRED)
def test_the_envelope_sees_what_a_multi_token_forward_does(family):
    """The backend fact the numeric contracts are judged by (treespec.evidence.numerics),
    checked directly for each zoo family inside the smallest sliding window
    (8): five tokens in one forward against five single steps. On the CPU's
    reference BLAS they are identical and the measured envelope is 0; on any
    backend, a difference seen here is seen by the envelope's own measurement
    (nonzero, and of the same size: within its bound)."""
    model = zoo.build(family)
    tokens = random_tokens(4, (1, 8))
    cache = make_prompt_cache(model)
    model(tokens[:, :3], cache=cache)
    together = model(tokens[:, 3:], cache=cache)
    cache = make_prompt_cache(model)
    model(tokens[:, :3], cache=cache)
    steps = mx.concatenate([model(tokens[:, i : i + 1], cache=cache) for i in range(3, 8)], axis=1)
    env = numerics.envelope(model, 3, range(1, 6))
    if exact_backend():  # the census found every op row-invariant: so must the model be
        assert mx.array_equal(together, steps)
        assert env.exact, env.line()
    same = mx.array_equal(together, steps).item()
    assert same or not env.exact, env.line()
    diff = float(mx.abs(together - steps).max())
    assert diff <= numerics.SAFETY * env.value, (diff, env.line())
