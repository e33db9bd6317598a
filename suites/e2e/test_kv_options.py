"""mlx-lm's KV cache options in speculative decoding (treespec.kv_options): with
``max_kv_size`` (a ring that wraps with its 4 kept slots included) or
``kv_bits`` (from any ``quantized_kv_start``), chain and tree decoding emit
exactly the tokens of mlx-lm's ``generate_step`` given the same options, for
both models' caches; the gate probes a wrapping run on a wrapped ring; where
the options cannot act or cannot be exact, decode refuses before anything
runs."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from suites.helpers_gate import gate_verdict
from suites.verdict import E2E, expect
from treespec import zoo
from treespec.decoding import decode
from treespec.errors import OptionError
from treespec.kv_options import probe_caches
from treespec.options import KVOptions
from treespec.verify import TreeAdapter, adapter_for

PROMPT = list(range(5, 25))
MAX_TOKENS = 32
MODES = {"chain": dict(mode="chain", block=6), "confidence": dict(mode="tree", budget=5),
         "fixed": dict(mode="tree", branching=[2, 2, 1])}
# (family, dtype, options, whether the options change mlx-lm's own text).
# The rings are mlx-lm's RotatingKVCache(max_kv_size, keep=4): one the run
# never fills, one the prompt wraps, one that wraps mid-run (past the gate
# probe's plain context, 24). The quantized cases start inside the
# generation, where a round must not straddle the start (the pair's case,
# 4-bit from 12, is suites/cli's).
CASES = {
    "qwen3 window": ("qwen3", "float32", dict(max_kv_size=80), False),
    "qwen3 window wrapped by the prompt": ("qwen3", "float32", dict(max_kv_size=12), True),
    "qwen3 window wrapping mid-run": ("qwen3", "float32", dict(max_kv_size=30), True),
    "qwen3 bfloat16 window wrapping mid-run": ("qwen3", "bfloat16", dict(max_kv_size=30), True),
    "qwen3 2-bit from 29": ("qwen3", "float32", dict(kv_bits=2, kv_group_size=32,
                                                     quantized_kv_start=29), True),
    "qwen3_5 3-bit from 29": ("qwen3_5", "float32", dict(kv_bits=3, kv_group_size=32,
                                                         quantized_kv_start=29), True),
}
_models = {}


def models(family, dtype="float32"):
    if (family, dtype) not in _models:
        _models[family, dtype] = zoo.build(family, dtype), zoo.drafter(family, dtype)
    return _models[family, dtype]


def mlx_lm_tokens(target, **kv):
    return [int(t) for t, _ in generate_step(mx.array(PROMPT), target, max_tokens=MAX_TOKENS,
                                             sampler=lambda lp: mx.argmax(lp, axis=-1), **kv)]


@pytest.mark.exactness
@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("family,dtype,kv,changes", CASES.values(), ids=CASES.keys())
def test_speculative_decoding_with_kv_options_is_mlx_lms_generate_with_them(
        family, dtype, kv, changes, mode):
    """On a ring that wraps, too: rounds verify the ring as one-token steps
    see it, 4 kept slots included, and commit what the path's steps write.
    Fails with a commit that swaps the last kept slot with the first ring
    slot once wrapped (treespec.caches.kv, tried: the prompt-wrapped case),
    and failed with the refusal this replaced (OptionError)."""
    target, draft = models(family, dtype)
    want = mlx_lm_tokens(target, **kv)
    assert (want != mlx_lm_tokens(target)) == changes  # what the case is about
    result = decode(target, PROMPT, draft_model=draft, max_tokens=MAX_TOKENS, **mode, **kv)
    assert result.tokens == want
    # Speculation ran where the probe found it exact (an exact regime must
    # run); else the gate declined, saying why (suites/helpers_gate).
    expect(gate_verdict(result.stats.summary()["gate"], result.stats.mode, mode["mode"]),
           E2E, family, dtype)
    classic = decode(target, PROMPT, max_tokens=MAX_TOKENS, **kv)
    assert classic.tokens == want


@pytest.mark.parametrize("max_kv_size", [48, 49, 50, 51, 80])
def test_the_gate_probes_on_a_wrapped_ring_exactly_the_runs_whose_ring_wraps(max_kv_size):
    """Whether the run's forwards wrap mlx-lm's ring decides whether the
    gate's probe crosses the ring too (treespec.kv_options.wraps). The
    reference: mlx-lm's cache fed what classic decoding feeds the model (the
    prompt, then every emitted token but the last, which is never fed) has
    seen more positions than its ring holds."""
    target, _ = models("qwen3")
    cache = make_prompt_cache(target, max_kv_size=max_kv_size)
    target(mx.array([PROMPT]), cache=cache)
    for t in mlx_lm_tokens(target, max_kv_size=max_kv_size)[:-1]:
        target(mx.array([[t]]), cache=cache)
    wrapped = cache[0].offset > cache[0].max_size
    (probed,) = probe_caches(KVOptions(max_kv_size=max_kv_size), len(PROMPT), MAX_TOKENS)
    assert probed.wraps == wrapped
    assert (probed.windows(target) == [max_kv_size] * len(cache)) == wrapped


class TimeOrderedRing(TreeAdapter):
    """Planted: a verify that feeds a sliding-window ring through mlx-lm's
    own multi-token update (the ring put in time order and trimmed to
    ``max_size - 1`` rows) instead of laying it out as one-token steps see it
    (treespec.ring): once the ring has wrapped, its nodes see other keys."""

    def _plans(self, attention, tree):
        return {}


@pytest.mark.exactness
@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_a_verify_wrong_only_on_a_wrapped_ring_is_declined_by_the_gate(mode):
    """The ring wraps mid-run (max_kv_size 30), past the probe's plain
    context: the gate probes the wrapped ring, so a verify wrong only there
    is declined with the probe's figures, and the text is classic decoding's.
    Fails with the probe left on an unwrapped ring (``wraps=False`` in
    probe_caches, tried): the gate passes and the run's tokens differ."""
    target, draft = models("qwen3")
    kv = dict(max_kv_size=30)
    planted = TimeOrderedRing(target, adapter_for(target).family)
    result = decode(target, PROMPT, draft_model=draft, max_tokens=MAX_TOKENS, adapter=planted,
                    adapter_name="planted: time-ordered ring", **mode, **kv)
    gate = result.stats.summary()["gate"]
    assert result.stats.mode == f"classic (declined {mode['mode']})", gate
    assert "shapes differ from single-token steps" in gate["reason"]
    assert result.tokens == mlx_lm_tokens(target, **kv)


REFUSED = {
    "a model with its own caches ignores max_kv_size": (
        "llama", dict(max_kv_size=512), "builds its own caches (make_cache)"),
    "quantization that never starts": (
        "qwen3", dict(kv_bits=8, kv_group_size=32, quantized_kv_start=100),
        "the cache would never be quantized"),
    "a sliding window mlx-lm cannot quantize": (
        "gemma3_text", dict(kv_bits=8, quantized_kv_start=0),
        "cannot quantize this model's RotatingKVCache"),
    "a head dim the group size does not divide": (
        "qwen3", dict(kv_bits=8, kv_group_size=64, quantized_kv_start=0),
        "divisible by the quantization group size 64"),
}


@pytest.mark.parametrize("family,kv,says", REFUSED.values(), ids=REFUSED.keys())
def test_kv_options_that_cannot_act_or_be_exact_are_refused_before_anything_runs(
        family, kv, says):
    target, draft = zoo.build(family), zoo.drafter(family)
    with pytest.raises(OptionError) as e:
        decode(target, PROMPT, mode="chain", draft_model=draft, max_tokens=MAX_TOKENS, **kv)
    assert says in str(e.value)
