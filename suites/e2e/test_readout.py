"""The greedy readout picks what classic decoding picks, in every dtype.

mlx-lm's generate_step hands its sampler ``logits - logsumexp(logits)`` in
the logits' dtype; in bfloat16 that subtraction rounds near-equal logits to
one value and argmax breaks the tie towards the lower id. A speculative
round that took the argmax of the raw logits would emit a different token
(seen on the H200: a 0.9B bf16 model's text left classic's at token 5)."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache

from treespec.rounds import greedy_readout

pytestmark = pytest.mark.exactness

VOCAB = 1000


class FixedLogits(nn.Module):
    """Every position's logits are one fixed row (the cache only counts)."""

    def __init__(self, row: mx.array):
        super().__init__()
        self.layers = [None]
        self._row = row

    def __call__(self, tokens, cache):
        x = mx.zeros((1, 1, tokens.shape[1], 1))
        cache[0].update_and_fetch(x, x)
        return mx.broadcast_to(self._row, (1, tokens.shape[1], self._row.shape[-1]))

    def make_cache(self):
        return [KVCache()]


def near_tie(dtype, high: float) -> mx.array:
    """All logits 3.0 but token 7 at ``high``: in bfloat16, 3.015625 is the
    next value above 3.0, and both become the same log-probability."""
    row = np.full(VOCAB, 3.0, dtype=np.float32)
    row[7] = high
    return mx.array(row).astype(dtype)


def classic_pick(row: mx.array) -> int:
    tok, _ = next(generate_step(mx.array([1, 2, 3]), FixedLogits(row), max_tokens=1,
                                sampler=lambda lp: mx.argmax(lp, axis=-1)))
    return int(tok)


@pytest.mark.parametrize("dtype, high", [(mx.bfloat16, 3.015625), (mx.bfloat16, 3.03125),
                                         (mx.float16, 3.001953125), (mx.float32, 3.0001)],
                         ids=["bf16-tie", "bf16-apart", "f16", "f32"])
def test_the_greedy_readout_is_generate_steps_pick(dtype, high):
    row = near_tie(dtype, high)
    rows = mx.stack([row, row[::-1]])  # a second node, its tie the other way round
    picks = greedy_readout(rows).tolist()
    assert picks == [classic_pick(row), classic_pick(row[::-1])]


def test_the_bf16_case_is_one_where_the_raw_argmax_differs():
    """The premise of the bf16-tie case: without the subtraction the pick
    differs, so the test above can fail."""
    row = near_tie(mx.bfloat16, 3.015625)
    assert int(mx.argmax(row)) == 7 != classic_pick(row)
