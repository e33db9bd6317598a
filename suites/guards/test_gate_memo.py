"""The gate's memo is keyed by the weights' content: an in-place edit of a
weight array (``w[0] = 0``, the same array object) gives a new key, so the
probe measures again instead of reusing the old verdict.

Where the regime is exact the verdict before the edit passes and the one
after it fails. Elsewhere the first may already decline (CUDA, in every
dtype): then the new measurement shows in the probe itself, a new key and
the NaN of the edited weights, and the decline is recorded as the verdict."""

import math
import platform

import mlx.core as mx
import pytest

from suites.helpers_gate import gate_verdict
from suites.helpers_numerics import model_label
from suites.verdict import GATE, expect
from treespec import zoo
from treespec.evidence import weights_digest as digest
from treespec.evidence.gate import configuration, decide, probe

pytestmark = pytest.mark.exactness

SHAPES = [(-1,), (-1, 0), (-1, 0, 0)]


def q_proj(model):
    return model.layers[0].self_attn.q_proj


def test_an_in_place_weight_edit_changes_the_weights_digest():
    model = zoo.build("llama")  # its own arrays: this test edits them
    before = configuration(model)["weights"]
    w = q_proj(model).weight
    w[0] = 0
    after = configuration(model)["weights"]
    assert after != before
    # The digest is the content's: the same edit made as a new array in a
    # model built apart hashes alike.
    other = zoo.build("llama")
    edited = mx.array(q_proj(other).weight)
    edited[0] = 0
    q_proj(other).weight = edited
    assert configuration(other)["weights"] == after
    assert configuration(zoo.build("llama"))["weights"] == before


def test_the_weights_digest_reads_every_piece_of_an_array(monkeypatch):
    """The digest hashes large arrays in pieces, apart and in parallel: an
    edit in any piece, the last one included, changes it; the same values
    under other strides (a transposed view) hash alike."""
    monkeypatch.setattr(digest, "PIECE", 64)  # a 4096-byte array in 64 pieces
    w = mx.arange(1024, dtype=mx.float32).reshape(32, 32)
    base = digest._hash_weights([("w", w)])
    for at in (0, 511, 1023):  # first, middle and last piece
        edited = mx.array(w).reshape(-1)
        edited[at] = -1
        assert digest._hash_weights([("w", edited.reshape(32, 32))]) != base, at
    assert digest._hash_weights([("w", mx.contiguous(w.T).T)]) == base
    assert digest._hash_weights([("v", w)]) != base  # the name is hashed too


def test_the_gate_measures_again_after_an_in_place_weight_edit():
    model = zoo.build("llama", "bfloat16")  # exact on both CPU regimes
    before = decide(model, SHAPES)
    verdict = gate_verdict(before.summary())  # exact regimes: it passes
    label = model_label(model)
    w = model.model.embed_tokens.weight
    w[:] = math.nan  # every logit NaN: a verdict measured now cannot pass
    decision = decide(model, SHAPES)
    assert not decision.run and not decision.exact, decision.reason
    if not before.exact:
        # A verdict reused from before the edit would decline as well: the
        # probe shows it measured the edited weights.
        assert decision.probe.key != before.probe.key, decision.reason
        assert math.isnan(decision.probe.max_abs_diff), decision.reason
    expect(verdict, GATE, *label)


@pytest.mark.parametrize("bits,group_size", [(None, None), (4, 64), (8, 32)])
def test_the_probe_key_names_the_weights_quantization(bits, group_size):
    """Models that differ only in their weights' quantization never share a
    verdict: the key names the bits and group size they were quantized with
    (none for an unquantized model, whose gate walks no module for them)."""
    kw = {} if bits is None else {"bits": bits, "group_size": group_size}
    config = configuration(zoo.build("llama", "bfloat16", **kw))
    assert config["weight_quant"] == ([] if bits is None else [f"{bits}bit/g{group_size}"])


@pytest.mark.parametrize("switch, name", [("MLX_ENABLE_TF32", "tf32"),
                                          ("MLX_CUDA_USE_CUDNN_SDPA", "cudnn_attention")])
def test_the_probe_key_names_the_machine_and_the_arithmetic_switches(switch, name, monkeypatch):
    """What can change a verdict besides the model and the BLAS is in the key:
    the device's name (a GPU model, an Apple chip, a paravirtual GPU), the OS,
    MLX's TF32 switch (float32 at TF32 precision on CUDA and M5) and its cuDNN
    attention switch (another rounding of multi-token attention on CUDA)."""
    model = zoo.build("llama")
    monkeypatch.setenv(switch, "0")
    off = configuration(model)
    assert off["machine"]["device_name"] == mx.device_info()["device_name"]
    assert off["machine"]["os"] == f"{platform.system()} {platform.release()}"
    monkeypatch.setenv(switch, "1")
    on = configuration(model)
    assert (off[name], on[name]) == ("0", "1")
    # Two probes, not one memo: the setting is in the key the memo is read by.
    key_on = probe(model, [(-1, 0, 0)]).key
    monkeypatch.setenv(switch, "0")
    assert probe(model, [(-1, 0, 0)]).key != key_on
