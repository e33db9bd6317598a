"""The row kernels (treespec.backend.row_kernels, ``--verify kernels``): on
MLX's CUDA backend every row of a several-row product they compute equals,
bit for bit, the layer called on that row alone (what a one-token step
calls); the row-invariant verify with them hands every node classic
decoding's logits. Elsewhere the mode is refused by name, and its seam (every
covered linear computed by the kernels' ``linear_rows``) is pinned with a
stand-in that computes each row alone, and a stand-in that moves one row,
which must break the identity."""

import mlx.core as mx
import mlx.nn as nn
import pytest

from suites.verify import helpers
from suites.verify.test_row_invariant import TREES, _bits_equal, _steps, _width
from treespec.backend import row_kernels
from treespec.evidence.controls import clone
from treespec.errors import TreeRefused
from treespec.tree import DraftTree
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness

CUDA = row_kernels.available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="the row kernels are CUDA kernels; this "
                                "backend refuses --verify kernels (test_refused_off_cuda)")


@pytest.mark.skipif(CUDA, reason="on CUDA the kernels run (the tests below)")
def test_refused_off_cuda():
    with pytest.raises(TreeRefused, match="the row kernels are CUDA kernels"):
        adapter_for(helpers.model("llama", "float32"), kernels=True)


@pytest.mark.parametrize("moved", [None, 3], ids=["rows alone", "one row moved"])
def test_every_covered_linear_goes_through_the_kernels_and_a_moved_row_shows(moved):
    model = helpers.model("llama", "bfloat16")
    tree = DraftTree(helpers.tokens(7, 3), TREES["branching 7"])
    if len(tree) > _width(model):
        pytest.skip(f"the census keeps this backend's attention rows for fewer than {len(tree)} nodes")
    kernels, called = helpers.kernel_seam(moved)
    adapter = adapter_for(model, kernels=kernels)
    before = helpers.history(9).replay(model)
    got = adapter.verify(tree, clone(before))
    want = _steps(model, before, tree)
    covered = {id(m) for _, m in model.named_modules()
               if isinstance(m, (nn.Linear, nn.QuantizedLinear)) and row_kernels.coverage(m) is None}
    assert covered and covered <= called  # every linear of the model, the output head included
    assert _bits_equal(got, want) == (moved is None), helpers.max_abs_diff(got, want)


@needs_cuda
@pytest.mark.parametrize("bits,group", [(4, 64), (8, 64), (4, 32), (4, 128), (2, 64)])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
@pytest.mark.parametrize("rows", [2, 5, 8, 13])
def test_quantized_rows_equal_the_one_row_call(rows, dtype, bits, group):
    k, n = 512, 384
    w = (mx.random.normal((n, k), key=mx.random.key(1)) * 0.05).astype(dtype)
    layer = nn.QuantizedLinear.from_linear(_linear(w), group_size=group, bits=bits)
    x = mx.random.normal((rows, 1, k), key=mx.random.key(2)).astype(dtype)
    got = row_kernels.linear_rows(layer, x)[:, 0]
    want = mx.concatenate([layer(x[i][None])[0] for i in range(rows)])
    assert _bits_equal(got, want), helpers.max_abs_diff(got, want)


@needs_cuda
@pytest.mark.parametrize("cols", row_kernels.COLS_CHOICES)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
@pytest.mark.parametrize("rows", [1, 5, 13])
def test_every_column_grouping_gives_each_row_the_one_row_calls_bits(rows, dtype, bits, cols):
    # How many output columns a warp carries is a cost choice: 390 columns
    # leave a partial group at every grouping, which must be computed too.
    k, n = 512, 390
    w = (mx.random.normal((n, k), key=mx.random.key(5)) * 0.05).astype(dtype)
    layer = nn.QuantizedLinear.from_linear(_linear(w), group_size=64, bits=bits)
    x = mx.random.normal((rows, k), key=mx.random.key(6)).astype(dtype)
    got = row_kernels.quantized_rows(x, layer.weight, layer.scales, layer.biases, bits, 64, cols=cols)
    want = mx.concatenate([layer(x[i][None]) for i in range(rows)])
    assert _bits_equal(got, want), helpers.max_abs_diff(got, want)


def test_a_column_grouping_the_kernel_is_not_built_for_is_refused_naming_it():
    x = mx.zeros((2, 64))
    with pytest.raises(ValueError, match=r"cols: one of \(1, 2, 4, 8\), not 3"):
        row_kernels.quantized_rows(x, mx.zeros((4, 8), mx.uint32), x, x, 4, 64, cols=3)


@needs_cuda
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
@pytest.mark.parametrize("rows", [2, 5, 13])
def test_dense_rows_equal_the_one_row_call(rows, dtype):
    layer = _linear((mx.random.normal((384, 512), key=mx.random.key(3)) * 0.05).astype(dtype))
    x = mx.random.normal((rows, 1, 512), key=mx.random.key(4)).astype(dtype)
    got = row_kernels.linear_rows(layer, x)[:, 0]
    want = mx.concatenate([layer(x[i][None])[0] for i in range(rows)])
    assert _bits_equal(got, want), helpers.max_abs_diff(got, want)


@needs_cuda
@pytest.mark.parametrize("shape", TREES, ids=list(TREES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_with_the_kernels_every_node_row_is_classic_decodings_one_token_step(family, dtype, shape):
    model = helpers.model(family, dtype)
    tree = DraftTree(helpers.tokens(len(TREES[shape]), 3), TREES[shape])
    adapter = adapter_for(model, kernels=True)
    before = helpers.history(9).replay(model)
    got = adapter.verify(tree, clone(before))
    want = _steps(model, before, tree)
    assert _bits_equal(got, want), (helpers.max_abs_diff(got, want), adapter.covered())


def _linear(w: mx.array) -> nn.Linear:
    layer = nn.Linear(w.shape[1], w.shape[0], bias=False)
    layer.weight = w
    return layer
