"""A backend check the ring layout of a sliding-window verify rests on.

A verify over a tree on a RotatingKVCache (treespec.ring) gives each node the
keys its classic one-token step sees, in the same relative order, but as one
row of a multi-query attention whose key array also holds keys masked away
for that row. That equals the one-token step bit for bit only where the
backend's attention sums its keys one after another (a masked key then adds
an exact zero) and runs a one-query attention through the same arithmetic as
a row of a multi-query one. MLX's CPU backend does (no fused CPU kernel in
0.32; a plain sequential softmax sum and matmul on Linux). A fused
single-query kernel, a SIMD or blocked reduction would not, and in half
precision the difference is too rare for a model-level probe to see.

So this checks the property itself, on random data, in float32 (where any
change of summation order shows) and in the model's dtypes:
``mx.fast.scaled_dot_product_attention`` of one query over its visible keys
(no mask, as a one-token step on a full ring) against the same query's row
of a multi-query attention over those keys interleaved with masked ones.
"""

from dataclasses import dataclass
from typing import Dict

import mlx.core as mx
import numpy as np


@dataclass(frozen=True)
class AttentionCheck:
    dtype: str
    identical: bool
    max_abs_diff: float
    draws: int


_MEMO: Dict[tuple, AttentionCheck] = {}


def interleaved_rows_match(dtype=mx.float32, draws: int = 8, seed: int = 0,
                           reorder: bool = False) -> AttentionCheck:
    """Whether every row of a masked multi-query attention equals a one-query
    attention over that row's visible keys, bit for bit (memoized per device
    and dtype). Sized so that a change of summation order shows in half
    precision too (hundreds of keys, thousands of outputs per draw).
    ``reorder``: the control, the one-query attention sees its keys in
    another order; it must differ."""
    key = (str(mx.default_device()), str(dtype), draws, seed, reorder)
    if key in _MEMO:
        return _MEMO[key]
    rng = np.random.RandomState(seed)
    worst, same = 0.0, True
    for _ in range(draws):
        heads, kv_heads, dim = 8, 2, 64
        keys_n, rows = int(rng.randint(64, 320)), int(rng.randint(2, 9))
        q = mx.array(rng.standard_normal((1, heads, rows, dim)), dtype=dtype)
        k = mx.array(rng.standard_normal((1, kv_heads, keys_n, dim)), dtype=dtype)
        v = mx.array(rng.standard_normal((1, kv_heads, keys_n, dim)), dtype=dtype)
        see = rng.random_sample((rows, keys_n)) < 0.6
        see[:, 0] = True  # every row sees something
        scale = dim ** -0.5
        multi = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mx.array(see))
        for i in range(rows):
            visible = np.flatnonzero(see[i])
            if reorder:
                visible = np.roll(visible, 1)
            cols = mx.array(visible.astype(np.int32))
            one = mx.fast.scaled_dot_product_attention(
                q[:, :, i : i + 1], mx.take(k, cols, axis=2), mx.take(v, cols, axis=2),
                scale=scale, mask=None)
            a, b = multi[:, :, i], one[:, :, 0]
            if not mx.array_equal(a, b).item():
                same = False
                worst = max(worst, mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max().item())
    _MEMO[key] = result = AttentionCheck(str(dtype).removeprefix("mlx.core."), same, worst, draws)
    return result
