"""The census tests' direct check, written without the census's code: the
rows of ``x[:M] @ w.T`` against ``x[i:i+1] @ w.T``, bit for bit. Imported by
the tests and by their preloaded-BLAS subprocesses. And what of a census two
runs must agree on (:func:`claims`)."""

import mlx.core as mx
import numpy as np

from treespec.backend import census as c


def direct_first(n_in: int, n_out: int, dtype, widths, seed: int = 7):
    """Smallest M of ``widths`` where a row of ``x[:M] @ w.T`` has other bits
    than ``x[i:i+1] @ w.T``, or None."""
    rng = np.random.default_rng(seed)
    w = mx.array(rng.standard_normal((n_out, n_in)).astype(np.float32)).astype(dtype)
    x = mx.array(rng.standard_normal((max(widths), n_in)).astype(np.float32)).astype(dtype)
    alone = [x[i:i + 1] @ w.T for i in range(max(widths))]
    for m in sorted(widths):
        together = x[:m] @ w.T
        for i in range(m):
            if not mx.array_equal(together[i:i + 1], alone[i]).item():
                return m
    return None


def claims(rows) -> list:
    """What a census says of each row (``Row`` objects or their ``to_json``
    dicts), for comparing two runs: whether and from which width it differs,
    every field but the max_diff of a differing row. That size is display,
    and an unsound kernel's (MLX CUDA's 4-bit quantized matmul at q4 g64
    64->128: results/census/README.md) differs from 2 every run by another
    size. An identical row keeps its max_diff (0.0, both runs)."""
    return [{k: v for k, v in d.items() if k != "max_diff" or d["first_differs"] is None}
            for d in (r if isinstance(r, dict) else c.to_json([r])[0] for r in rows)]
