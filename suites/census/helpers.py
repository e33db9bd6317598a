"""The census tests' direct check, written without the census's code: the
rows of ``x[:M] @ w.T`` against ``x[i:i+1] @ w.T``, bit for bit. Imported by
the tests and by their preloaded-BLAS subprocesses."""

import mlx.core as mx
import numpy as np


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
