"""The row-invariant verify with its linears in chunks (``--verify chunks``,
treespec.backend.row_chunks): every linear layer runs in calls of at most the
rows the census measures this backend's products keep, so a tree of any
width gets, at every node, classic decoding's one-token step bit for bit,
where the rest of the layer (attention's batch rows, norms, rope) keeps its
rows too. On a backend whose wider products sum in another order (OpenBLAS
in float32: from 4 rows for the zoo's shapes) this is where ``--verify rows``
stops (it caps rounds at that width) and the flat verify is declined.

Here: the chunks' calls, the plan against planted census rows, and that the
per-node check (suites/verify/test_row_invariant.py, mode "chunks": one-token
steps of mlx-lm's own forward as the reference) separates a row planted one
bit step off, on every backend."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from suites.verify import helpers
from suites.verify.test_row_invariant import _steps
from treespec.backend.census import Row
from treespec.backend.row_chunks import RowChunks
from treespec.cli.rows import chunks_plan
from treespec.errors import UsageError
from treespec.evidence.controls import clone
from treespec.tree import DraftTree
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness

def _layers(dtype):
    rng = np.random.RandomState(0)
    dense = nn.Linear(64, 96, bias=False)
    dense.weight = mx.array(rng.standard_normal((96, 64)), dtype=dtype)
    quantized = nn.QuantizedLinear.from_linear(dense, group_size=32, bits=4)
    head = nn.Embedding(96, 64)  # as_linear: a tied output head
    head.weight = mx.array(rng.standard_normal((96, 64)), dtype=dtype)
    return {"dense": dense, "4-bit": quantized, "tied head": head}


def _alone(layer, x, axis, i):
    call = layer.as_linear if isinstance(layer, nn.Embedding) else layer
    return call(mx.take(x, mx.array([i]), axis=axis))


@pytest.mark.parametrize("kind", ["dense", "4-bit", "tied head"])
@pytest.mark.parametrize("axis", [0, 1], ids=["nodes on the batch axis", "nodes as tokens"])
def test_in_calls_of_one_row_every_row_is_its_own_one_row_call(kind, axis):
    # A one-token step's product is a one-row call: chunks of one row repeat
    # it exactly, on any backend (the same call, the same kernel).
    layer = _layers(mx.float32)[kind]
    shape = (7, 1, 64) if axis == 0 else (1, 7, 64)
    x = mx.array(np.random.RandomState(1).standard_normal(shape), dtype=mx.float32)
    got = RowChunks(1).linear_rows(layer, x)
    assert got.shape == shape[:-1] + (96,)
    for i in range(7):
        row = mx.take(got, mx.array([i]), axis=axis)
        assert mx.array_equal(row, _alone(layer, x, axis, i)).item(), (kind, i)


class _Recorded(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.shapes = []

    def __call__(self, x):
        self.shapes.append(tuple(x.shape))
        return self.inner(x)


@pytest.mark.parametrize("width, calls", [(3, [3, 3, 1]), (7, [7]), (10, [7])])
def test_each_call_takes_at_most_width_rows_in_the_layout_it_came_in(width, calls):
    layer = _Recorded(_layers(mx.float32)["dense"])
    x = mx.array(np.random.RandomState(2).standard_normal((7, 1, 64)), dtype=mx.float32)
    got = RowChunks(width).linear_rows(layer, x)
    assert layer.shapes == [(n, 1, 64) for n in calls]
    # the rows come back in node order: each equals its own one-row call's
    # wherever the backend keeps a row's bits over that call's width; the
    # order alone is checked here against a layer with no arithmetic in it
    ident = _Recorded(lambda v: v)
    assert mx.array_equal(RowChunks(width).linear_rows(ident, x), x).item()
    assert got.shape == (7, 1, 96)


@pytest.mark.parametrize("width", [0, -1, 1.5, True, "3"])
def test_a_width_that_is_no_count_of_rows_is_refused_naming_it(width):
    with pytest.raises(ValueError, match="width"):
        RowChunks(width)


def test_rows_on_two_axes_are_refused_not_reshaped():
    x = mx.zeros((2, 3, 64))
    with pytest.raises(ValueError, match="more than one axis"):
        RowChunks(2).linear_rows(_layers(mx.float32)["dense"], x)


def _census(product=None, rest=None, error=None):
    def measure(model, widths):
        ws = tuple(widths)
        return [Row("matmul", "float32", "64->384", ws, product, 0.0 if product is None else 1e-6,
                    error=error),
                Row("sdpa", "float32", "heads 4/2 dim 16", ws, rest,
                    0.0 if rest is None else 1e-6, how="batch"),
                # not a row the row-invariant verify rests on: never a limit
                Row("sdpa+mask", "float32", "heads 4/2 dim 16", ws, 2, 1e-6)]
    return measure


def test_the_plan_chunks_at_the_products_width_and_caps_at_the_rest():
    # A round of budget 6 (7 nodes): planted census rows, as the census of
    # the target's own shapes would give them.
    plan = chunks_plan(None, 6, False, measure=_census(product=4))
    assert (plan.width, plan.cap) == (3, None) and "matmul tokens float32 64->384" in plan.why
    assert chunks_plan(None, 6, False, measure=_census()).width == 7  # every width kept
    assert chunks_plan(None, 6, False, measure=_census(product=2)).width == 1
    plan = chunks_plan(None, 6, False, measure=_census(product=4, rest=5))
    assert plan.width == 3 and plan.cap[0] == 4 and "sdpa batch" in plan.cap[1]
    assert chunks_plan(None, 6, True, measure=_census(product=4, rest=5)).cap is None
    with pytest.raises(UsageError, match="--verify chunks: .*one node only outside the products"):
        chunks_plan(None, 6, False, measure=_census(rest=2))
    with pytest.raises(UsageError, match="--verify chunks: a product .* could not run"):
        chunks_plan(None, 6, False, measure=_census(error="No implementation"))


class _OneChunkOff(RowChunks):
    """Chunks with a defect: the last row of every product moved by one part
    in 2^7 (a factor every float dtype holds exactly)."""

    def linear_rows(self, layer, x):
        y = super().linear_rows(layer, x)
        axis = 0 if x.shape[0] > 1 else 1
        n = y.shape[axis]
        scale = mx.where(mx.arange(n) >= n - 1, 1 + 2 ** -7, 1.0).astype(y.dtype)
        return y * scale.reshape([-1 if a == axis else 1 for a in range(y.ndim)])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_chunked_verifys_check_separates_a_row_one_bit_step_off(dtype):
    # suites/verify/test_row_invariant.py compares the chunked verify with
    # one-token steps per family, dtype and tree; the same comparison with one
    # row of every product planted off must fail, on any backend.
    model = helpers.model("llama", dtype)
    tree = DraftTree(helpers.tokens(7, 3), [-1, 0, 0, 1, 1, 2, 4])
    before = helpers.history(9).replay(model)
    want = _steps(model, before, tree)
    width = chunks_plan(model, len(tree) - 1, True).width
    off = adapter_for(model, kernels=_OneChunkOff(width)).verify(tree, clone(before))
    assert not mx.array_equal(off, want).item()
