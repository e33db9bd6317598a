"""The census's comparison itself (treespec.backend.census): a row of an
M-row call against that row computed alone, bit for bit, from which M.

Checked on synthetic ops whose dependence on M is planted and known, so the
answer does not come from the backend under test: an op that is
row-invariant is reported identical at every M, and one that changes a row
by M (an added M-dependent epsilon, a summation order that changes with M,
a rounding that depends on a row's place in the call, a recurrence whose
T=M call keeps another state than its chained steps) is reported from
exactly the M where the plant fires, with the planted size. Tried: with
``_differs`` answering "same" for every pair, every planted test fails;
with ``against_alone`` comparing only the first row, the row-place test
fails (it reports None).
"""

import mlx.core as mx
import numpy as np
import pytest

from suites.census.helpers import claims
from treespec.backend import census as c

pytestmark = pytest.mark.exactness

WIDTHS = tuple(range(1, 9))
EPS = 2.0 ** -10  # exact on values in [1, 2): float32 has 2^-23 there


def rows(width=8, cols=16, seed=0):
    """Values in [1, 2), so adding EPS is exact and its difference is EPS."""
    rng = np.random.default_rng(seed)
    return mx.array(1.0 + rng.random((width, cols)).astype(np.float32))


def test_a_row_invariant_op_is_identical_at_every_width():
    first, diff = c.measure_rows(lambda x: x * 3.0 - x.sum(axis=-1, keepdims=True), rows(), WIDTHS)
    assert (first, diff) == (None, 0.0)


@pytest.mark.parametrize("fires", [2, 5, 8])
def test_an_m_dependent_epsilon_is_reported_from_the_m_it_fires_at_with_its_size(fires):
    def op(x):
        return x + (EPS if x.shape[0] >= fires else 0.0)

    assert c.measure_rows(op, rows(), WIDTHS) == (fires, EPS)
    # and not seen where the widths stop short of it
    assert c.measure_rows(op, rows(), range(1, fires)) == (None, 0.0)


def test_a_summation_order_that_changes_with_m_is_reported_from_that_m():
    """Left-to-right sums for M < 3, right-to-left from M = 3: a BLAS that picks
    its kernel by M. The reference for the size is numpy's own two orders."""

    def op(x):
        cols = [x[:, j] for j in range(x.shape[1])]
        if x.shape[0] >= 3:
            cols = cols[::-1]
        total = cols[0]
        for col in cols[1:]:
            total = total + col
        return total[:, None]

    x = rows(cols=64)
    first, diff = c.measure_rows(op, x, WIDTHS)
    xs = np.array(x)
    left = np.zeros(len(xs), np.float32)
    right = np.zeros(len(xs), np.float32)
    for j in range(xs.shape[1]):
        left, right = left + xs[:, j], right + xs[:, -1 - j]
    assert (left[:3] != right[:3]).any()  # the two orders differ on these rows
    assert first == 3
    assert diff == float(np.abs(left - right).max())


def test_a_rounding_by_a_rows_place_is_found_on_that_row():
    """Rows from the fourth on are rounded differently in a call of M >= 4
    (OpenBLAS on Zen rounds a row by its place): only row 3 onwards differ,
    so only a comparison of every row finds it, from M = 4."""

    def op(x):
        shift = mx.where(mx.arange(x.shape[0])[:, None] >= 3, EPS, 0.0)
        return x + shift

    assert c.measure_rows(op, rows(), WIDTHS) == (4, EPS)


def test_rows_on_the_batch_or_the_token_axis_are_compared_alike():
    def op(x):  # M counted on the axis the rows are on
        return x + (EPS if x.shape[1] >= 6 else 0.0)

    assert c.measure_rows(op, rows()[None], WIDTHS, axis=1) == (6, EPS)


def test_bits_not_values_are_compared():
    """-0.0 == 0.0 as values, not as bits: an op that flips a zero's sign
    from M = 2 differs (a later 1/x would tell them apart)."""

    def op(x):
        zero = mx.zeros_like(x)
        return -zero if x.shape[0] >= 2 else zero

    first, diff = c.measure_rows(op, rows(), WIDTHS)
    assert first == 2 and diff == 0.0


def test_a_recurrence_whose_state_differs_from_its_steps_is_found_though_outputs_agree():
    """``steps``: one T=M call against M chained T=1 calls compares the final
    state too. The planted T=M call keeps a state off by EPS from M = 3 while
    every output is right."""
    x = rows(width=8, cols=4)[None]  # (1, T, 4)

    def step(i, j, state):
        outs, s = [], state
        for t in range(i, j):
            s = s * 0.5 + x[:, t]
            outs.append(s)
        if j - i >= 3:
            s = s + EPS
        return mx.stack(outs, axis=1), s

    pairs = c.against_steps(step, 8, mx.ones((1, 4)))
    assert c.measure(pairs, WIDTHS) == (3, EPS)


def test_the_census_api_validates_and_reads_its_rows():
    with pytest.raises(ValueError, match="widths"):
        c.census(widths=(0, 1))
    with pytest.raises(ValueError, match="dtypes"):
        c.census(dtypes=("float64",))
    rows_ = [c.Row("matmul", "float32", "8->8", (1, 2, 3), None, 0.0),
             c.Row("matmul", "float32", "8->8", (1, 2, 3), 2, 1e-6, how="batch")]
    assert c.inexact(rows_) == rows_[1:]
    table = c.format_table(rows_)
    assert "identical up to 3" in table and "differs from 2" in table and "1e-06" in table
    assert c.summary(rows_) == "differs: matmul batch: float32 from 2"
    assert c.widths_text((1, 2, 3, 4, 8, 16, 17)) == "1..4,8,16,17"


def test_the_default_census_covers_every_op_in_every_dtype():
    got = c.census(widths=(1, 2))
    ops = {(r.op, r.how) for r in got}
    assert ops >= {("matmul", "tokens"), ("matmul", "batch"), ("quantized_matmul", "tokens"),
                   ("sdpa", "tokens"), ("sdpa+mask", "tokens"), ("sdpa+additive", "tokens"),
                   ("sdpa+causal", "tokens"), ("sdpa", "batch"), ("rms_norm", "tokens"),
                   ("rope", "tokens"),
                   ("rope", "batch"), ("conv1d", "steps"), ("conv1d", "batch"),
                   ("gated_delta", "steps"), ("gated_delta", "batch")}
    assert {r.dtype for r in got} == set(c.DTYPES)
    assert all(r.widths == (1, 2) and r.error is None for r in got), [r for r in got if r.error]
    # one seed, one census: reproducible, each row's verdict and width
    assert claims(c.census(widths=(1, 2))) == claims(got)


def test_the_row_invariant_width_is_the_smallest_cap_of_the_rows_that_verify_rests_on():
    # --verify rows runs attention, projections and rope on the batch axis and the
    # rest of a layer over T token rows: the flat verify's attention and rope token
    # rows and the recurrent steps rows do not limit it; an op that could not run does
    def row(op, how, first, dtype="float32", error=None):
        return c.Row(op, dtype, "s", (1, 2, 3, 4, 5, 6), first, 0.0 if first is None else 1e-6,
                     how, error)

    rows_ = [row("matmul", "tokens", 5), row("matmul", "batch", None), row("sdpa", "batch", None),
             row("sdpa+mask", "tokens", 2), row("rope", "tokens", 2), row("ssm_update", "steps", 2),
             row("rms_norm", "tokens", None), row("matmul", "tokens", 2, dtype="bfloat16")]
    assert c.row_width(rows_, "float32") == (4, [rows_[0]])
    assert c.row_width(rows_, "bfloat16") == (1, [rows_[-1]])
    assert c.row_width(rows_) == (1, [rows_[-1]])
    assert c.row_width([row("sdpa", "batch", 3)]) == (2, [row("sdpa", "batch", 3)])
    assert c.row_width([row("sdpa", "batch", None)])[0] == 6
    broken = row("gated_delta", "batch", None, error="RuntimeError: no kernel")
    assert c.row_width([broken, rows_[1]]) == (0, [broken])
    assert c.row_width([rows_[3], rows_[5]]) == (None, [])
