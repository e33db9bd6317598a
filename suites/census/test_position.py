"""The census's position rows (treespec.backend.census_position): whether a
row's bits depend on its place in an M-row call of one M, or on the rows
beside it, and not only on M.

Checked on synthetic ops whose dependence is planted and known, so the
answer does not come from the backend under test: an op that depends on M
alone (the property a reference at the verify's width rests on) and a
row-invariant one are identical at every M, where the ``tokens`` comparison
tells the first apart from its rows alone; an op that rounds a row by its
index, or mixes in its neighbours, differs from exactly the M where the
plant fires, with the planted size. Tried: with ``placed`` putting the
probe at index 0 in every call (fresh neighbours still), the index test
fails (it reports None) while the neighbour test still passes, as it should.
"""

import mlx.core as mx
import numpy as np
import pytest

from suites.census.helpers import claims
from treespec.backend import census as c
from treespec.backend import census_position as p

pytestmark = pytest.mark.exactness

WIDTHS = tuple(range(1, 9))
EPS = 2.0 ** -10  # exact on values in [1, 2): float32 has 2^-23 there


def probe_and_neighbours(cols=16, seed=0):
    """Values in [1, 2) on the token axis (1, rows, cols), so adding EPS is exact."""
    rng = np.random.default_rng(seed)
    probe = mx.array(1.0 + rng.random((1, 1, cols)).astype(np.float32))
    drawn = {}

    def neighbours(m, k):
        if (m, k) not in drawn:
            drawn[(m, k)] = mx.array(1.0 + rng.random((1, m - 1, cols)).astype(np.float32))
        return drawn[(m, k)]

    return probe, neighbours


def by_width(x):  # a kernel picked by M alone: every row of an M-row call moved alike
    return x + (EPS if x.shape[1] >= 3 else 0.0)


def by_index(x):  # rows from index 4 on rounded otherwise in calls of M >= 5
    return x + mx.where(mx.arange(x.shape[1])[None, :, None] >= 4, EPS, 0.0)


def by_neighbours(x):  # each row moved by its neighbours' sum, from M = 6
    if x.shape[1] < 6:
        return x
    return x + EPS * (x.sum(axis=1, keepdims=True) - x)


def measured(fn, widths=WIDTHS):
    probe, neighbours = probe_and_neighbours()
    return c.measure(p.placed(lambda x, j: fn(x), probe, neighbours), widths)


def test_an_op_that_depends_on_m_alone_is_identical_at_every_place_though_not_alone():
    # the tokens comparison sees the width term; the position comparison does not
    x = mx.concatenate([probe_and_neighbours()[0]] * 8, axis=1)
    assert c.measure_rows(by_width, x, WIDTHS, axis=1) == (3, EPS)
    assert measured(by_width) == (None, 0.0)
    assert measured(lambda x: x * 3.0 - x.sum(axis=-1, keepdims=True)) == (None, 0.0)


@pytest.mark.parametrize("op, fires", [(by_index, 5), (by_neighbours, 6)],
                         ids=["index", "neighbours"])
def test_a_row_that_depends_on_its_place_or_neighbours_is_found_from_that_m(op, fires):
    first, diff = measured(op)
    assert first == fires and diff > 0.0
    if op is by_index:
        assert diff == EPS
    # and not seen where the widths stop short of it
    assert measured(op, range(1, fires)) == (None, 0.0)


def test_the_position_census_covers_its_ops_in_every_dtype_and_is_reproducible():
    got = p.position_census(widths=(1, 3))
    assert {r.op for r in got} == {"matmul", "quantized_matmul", "sdpa+mask", "rms_norm"}
    assert {r.how for r in got} == {p.HOW} and {r.dtype for r in got} == set(c.DTYPES)
    assert all(r.widths == (1, 3) and r.error is None for r in got), [r for r in got if r.error]
    assert claims(p.position_census(widths=(1, 3))) == claims(got)


def test_the_position_width_is_the_smallest_cap_of_the_position_rows_only():
    def row(op, how, first, dtype="float32", error=None):
        return c.Row(op, dtype, "s", (1, 2, 3, 4, 5, 6), first, 0.0 if first is None else 1e-6,
                     how, error)

    rows = [row("matmul", "tokens", 2), row("matmul", p.HOW, None), row("sdpa+mask", p.HOW, 5),
            row("rms_norm", p.HOW, 3, dtype="bfloat16")]
    assert p.position_width(rows, "float32") == (4, [rows[2]])
    assert p.position_width(rows, "bfloat16") == (2, [rows[3]])
    assert p.position_width(rows) == (2, [rows[3]])
    assert p.position_width(rows[:1]) == (None, [])  # a tokens row never limits it
    assert c.row_width(rows[1:3]) == (None, [])  # nor a position row the row-invariant width
    broken = row("matmul", p.HOW, None, error="RuntimeError: no kernel")
    assert p.position_width([broken, rows[1]]) == (0, [broken])
