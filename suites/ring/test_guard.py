"""The guard the ring layout needs (treespec.backend.attention_check): it holds only
where a masked row of a multi-query attention is, bit for bit, a one-query
attention over that row's visible keys. The check must see a change of
summation order in every dtype (its control), and a backend whose one-query
attention sums differently (as a fused single-query kernel would) must make
the gate decline sliding-window models, even in bfloat16, where a
model-level probe rarely sees the difference."""

import mlx.core as mx
import pytest

from treespec.backend import attention_check
from treespec.evidence import gate
from treespec import zoo
from treespec.backend.attention_check import interleaved_rows_match
from treespec.evidence.gate import RING_DRAWS, decide, shapes_for

pytestmark = pytest.mark.exactness

DTYPES = [mx.float32, mx.bfloat16, mx.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_check_sees_a_reordered_sum_in_every_dtype(dtype):
    assert not interleaved_rows_match(dtype, draws=RING_DRAWS, reorder=True).identical


@pytest.fixture
def one_query_attention_summed_backwards(monkeypatch):
    """A planted backend: one-query, unmasked attention (a one-token step on
    a full ring) sums its keys in reverse order; everything else as MLX does."""
    real = mx.fast.scaled_dot_product_attention

    def sdpa(q, k, v, *args, mask=None, **kwargs):
        if q.shape[2] == 1 and mask is None and k.shape[2] > 1:
            k, v = k[:, :, ::-1], v[:, :, ::-1]
        return real(q, k, v, *args, mask=mask, **kwargs)

    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", sdpa)
    monkeypatch.setattr(attention_check, "_MEMO", {})
    monkeypatch.setattr(gate, "_MEMO", {})


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_check_fails_on_a_backend_that_sums_one_query_differently(
        dtype, one_query_attention_summed_backwards):
    assert not interleaved_rows_match(dtype, draws=RING_DRAWS).identical


@pytest.mark.parametrize("family, dtype", [("gemma3_text", "bfloat16"), ("gemma4_text", "float16")])
def test_the_gate_declines_a_sliding_window_model_on_such_a_backend(
        family, dtype, one_query_attention_summed_backwards):
    model = zoo.build(family, dtype)
    d = decide(model, shapes_for(3))
    assert not d.run
    assert not all(c.identical for c in d.probe.checks)
    assert "one-query" in d.reason or "differ" in d.reason, d.reason


def test_models_without_a_window_are_not_held_to_it(one_query_attention_summed_backwards):
    """The check is about rings: a plain KVCache model's one-token step
    attends its keys in time order, as its verify does."""
    model = zoo.build("llama", "bfloat16")
    assert decide(model, shapes_for(2)).probe.checks == []
