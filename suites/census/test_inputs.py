"""The census's cancelling draw (treespec.backend.census_inputs): in half
precision, a product whose M-row calls sum a row in another order than the
row alone is found from M = 2, where a draw of normal inputs alone can miss
it over every width (the H100's bfloat16 MLP rows at 45add88,
results/exact-at-speed/README.md); and a product that keeps its order is
still identical on it (the draw adds no difference of its own)."""

import mlx.core as mx
import numpy as np
import pytest

from treespec.backend import census as C
from treespec.backend.census import WIDTHS, measure_rows
from treespec.backend.census_inputs import cancel_at, cancelling, equal_columns, normal

SHAPES = [(64, 128), (256, 704), (1024, 1024), (64, 4)]


def _product(w, split: bool):
    """``x @ w.T`` summed in float32 and rounded to x's dtype; ``split``: an
    M-row call (M >= 2) sums each row's two halves apart, as a split
    reduction or another tile would, while a row alone sums straight."""
    f, h = w.astype(mx.float32), w.shape[1] // 2

    def fn(x):
        xf = x.astype(mx.float32)
        if split and x.shape[1] >= 2:
            return (xf[..., :h] @ f[:, :h].T + xf[..., h:] @ f[:, h:].T).astype(x.dtype)
        return (xf @ f.T).astype(x.dtype)

    return fn


def _draws(dtype, n_in, n_out):
    rng = np.random.default_rng(0)
    at = cancel_at(dtype, n_in)
    w = equal_columns(normal(rng, (n_out, n_in), dtype, n_in ** -0.5), at)
    x = normal(rng, (1, WIDTHS[-1], n_in), dtype)
    return w, x, cancelling(x, at)


@pytest.mark.parametrize("n_in,n_out", SHAPES, ids=[f"{i}->{o}" for i, o in SHAPES])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bfloat16", "float16"])
def test_the_cancelling_draw_finds_another_summation_order_from_two_rows(dtype, n_in, n_out):
    w, _, cancel = _draws(dtype, n_in, n_out)
    assert measure_rows(_product(w, split=True), cancel, WIDTHS, axis=1)[0] == 2
    assert measure_rows(_product(w, split=False), cancel, WIDTHS, axis=1)[0] is None


def test_normal_draws_alone_miss_it_where_bfloat16_rounds_it_away():
    # Why the census draws twice: at the zoo's 64 -> 128 in bfloat16 the
    # split order rounds to the same bits on every row of every width.
    w, x, _ = _draws(mx.bfloat16, 64, 128)
    assert measure_rows(_product(w, split=True), x, WIDTHS, axis=1)[0] is None


def test_the_census_draws_it_for_every_half_precision_product_row(monkeypatch):
    drawn = []
    real = C.cancelling
    monkeypatch.setattr(C, "cancelling", lambda x, at: drawn.append((x.dtype, at)) or real(x, at))
    rows = C.census(dtypes=("float32", "bfloat16", "float16"), widths=(1, 2))
    products = [r for r in rows if r.op in ("matmul", "addmm", "quantized_matmul")]
    half = [r for r in products if r.dtype != "float32"]
    assert half and len(drawn) == len(half)
    assert {d for d, _ in drawn} == {mx.bfloat16, mx.float16}
    assert cancel_at(mx.float32, 64) is None
    assert cancel_at(mx.bfloat16, 256, group=64) == (0, 63)  # within one quantization group
