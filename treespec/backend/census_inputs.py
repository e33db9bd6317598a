"""The census's inputs (nothing is measured here): seeded normal draws, and
for products in half precision a second, cancelling draw.

Why the second. An M-row product that sums a row in another order than the
row alone computes (a GEMM kernel against a GEMV one, a split reduction,
another tile) gets other float32 partial sums; rounded to a bfloat16 or
float16 result, most outputs still land on the same bits, so one draw of
normal inputs seldom shows the order. On an H100 at 45add88 it did not: the
census kept a zoo qwen3_5's bfloat16 rows invariant at 2 and more, and the
row-invariant verify's MLP rows (64 -> 128, 2 tokens) differed from
one-token steps (results/exact-at-speed/README.md#the-census-missed-a-half-precision-order).

The cancelling draw puts +A and -A at two inputs far apart whose weights
are equal: the exact sum is the other terms', but a running sum holding A
rounds them at A's magnitude on the way, and every order rounds them
differently, well above the result's half ulp. The census reads only a
difference from it; equal bits on both draws are what it reports as
identical, as before.
"""

from typing import Optional, Tuple

import mlx.core as mx
import numpy as np

__all__ = ["CANCEL", "cancel_at", "cancelling", "equal_columns", "joined", "normal"]

# |A| per dtype: large enough that float32 partial sums holding it round the
# other terms (products of about unit size) by far more than the result's
# half ulp, small enough that the dtype holds A (float16: at most 65504).
CANCEL = {mx.bfloat16: 2.0 ** 20, mx.float16: 2.0 ** 15}


def normal(rng, shape, dtype, scale: float = 1.0) -> mx.array:
    return mx.array(rng.standard_normal(shape).astype(np.float32) * scale).astype(dtype)


def cancel_at(dtype, n_in: int, group: Optional[int] = None) -> Optional[Tuple[int, int]]:
    """The two input positions of the cancelling draw: the first and last of
    the first quantization group (one scale: equal weights stay equal once
    quantized), else of the row. None where ``dtype`` gets no such draw
    (float32: its own rounding shows an order on normal draws)."""
    if dtype not in CANCEL or n_in < 2:
        return None
    return 0, min(n_in, group or n_in) - 1


def equal_columns(w: mx.array, at: Optional[Tuple[int, int]]) -> mx.array:
    """``w`` (out, in) with input column ``at[1]`` a copy of ``at[0]``."""
    if at is None:
        return w
    w = mx.array(w)
    w[:, at[1]] = w[:, at[0]]
    return w


def cancelling(x: mx.array, at: Tuple[int, int]) -> mx.array:
    """``x`` with +A at input ``at[0]`` and -A at ``at[1]`` (the last axis) in
    every row."""
    a = CANCEL[x.dtype]
    x = mx.array(x)
    x[..., at[0]] = a
    x[..., at[1]] = -a
    return x


def joined(*draws):
    """One ``pairs_at(M)`` (treespec.backend.census.measure) of several
    draws' pairs: a row differs if it differs on any draw."""
    return lambda m: [pair for pairs_at in draws for pair in pairs_at(m)]
