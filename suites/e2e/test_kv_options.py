"""mlx-lm's KV cache options in speculative decoding (treespec.kv_options): with
``max_kv_size`` or ``kv_bits`` (from any ``quantized_kv_start``), chain and
tree decoding emit exactly the tokens of mlx-lm's ``generate_step`` given
the same options, for both models' caches; where the options cannot act or
cannot be exact, decode refuses before anything runs."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from treespec import zoo
from treespec.backend.blas import detect
from treespec.decoding import decode
from treespec.errors import OptionError

PROMPT = list(range(5, 25))
MAX_TOKENS = 32
MODES = {"chain": dict(mode="chain", block=6), "confidence": dict(mode="tree", budget=5),
         "fixed": dict(mode="tree", branching=[2, 2, 1])}
# (family, options, whether the options change mlx-lm's own text). The
# quantized cases start inside the generation, where a round must not
# straddle the start (the pair's case, 4-bit from 12, is suites/cli's).
CASES = {
    "qwen3 window": ("qwen3", dict(max_kv_size=80), False),
    "qwen3 2-bit from 29": ("qwen3", dict(kv_bits=2, kv_group_size=32, quantized_kv_start=29),
                            True),
    "qwen3_5 3-bit from 29": ("qwen3_5", dict(kv_bits=3, kv_group_size=32,
                                              quantized_kv_start=29), True),
}
_models = {}


def models(family):
    if family not in _models:
        _models[family] = zoo.build(family), zoo.drafter(family)
    return _models[family]


def mlx_lm_tokens(target, **kv):
    return [int(t) for t, _ in generate_step(mx.array(PROMPT), target, max_tokens=MAX_TOKENS,
                                             sampler=lambda lp: mx.argmax(lp, axis=-1), **kv)]


@pytest.mark.exactness
@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("family,kv,changes", CASES.values(), ids=CASES.keys())
def test_speculative_decoding_with_kv_options_is_mlx_lms_generate_with_them(
        family, kv, changes, mode):
    target, draft = models(family)
    want = mlx_lm_tokens(target, **kv)
    assert (want != mlx_lm_tokens(target)) == changes  # what the case is about
    result = decode(target, PROMPT, draft_model=draft, max_tokens=MAX_TOKENS, **mode, **kv)
    assert result.tokens == want
    if detect().name == "reference":  # bit-identical there; elsewhere the gate may decline
        assert result.stats.mode == mode["mode"] and result.stats.gate["exact"]
    classic = decode(target, PROMPT, max_tokens=MAX_TOKENS, **kv)
    assert classic.tokens == want


REFUSED = {
    "a model with its own caches ignores max_kv_size": (
        "llama", dict(max_kv_size=512), "builds its own caches (make_cache)"),
    "a window that would wrap": (
        "qwen3", dict(max_kv_size=50), "would wrap in this run (prompt 20 + max tokens 32 + 3"),
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
