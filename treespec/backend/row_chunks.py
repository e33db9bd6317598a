"""Linear layers in chunks of rows the backend keeps: every row as a
one-token step computes it, with MLX's own kernels, on any backend.

A backend's product gives a row of an M-row call the bits of that row alone
only up to some M (the census measures it per shape, layout and dtype:
treespec.backend.census; under OpenBLAS in float32, 3 for the zoo's shapes).
Where no row kernel exists (treespec.backend.row_kernels is CUDA's), a T-row
product can still give every row a one-token step's bits: as ceil(T / width)
calls of at most ``width`` rows each, in the layout it came in, each call
one the census measured identical to its rows alone. The weights are read
once a chunk instead of once, the price of exactness where the backend's
wider calls sum in another order.

:class:`RowChunks` has the three functions the row-invariant verify asks of
its kernels (``available``, ``coverage``, ``linear_rows``), so
``adapter_for(model, kernels=RowChunks(width))`` is that verify with every
linear layer chunked. Nothing here is declared exact: the width comes from a
measurement, and the gate measures the verify.
"""

from typing import List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn

from .census import Row, narrowest, row_invariant

__all__ = ["PRODUCTS", "RowChunks", "chunk_width", "rest_width"]

PRODUCTS = ("matmul", "addmm", "quantized_matmul")  # the census ops a linear layer is


def chunk_width(rows: Sequence[Row], dtype: Optional[str] = None
                ) -> Tuple[Optional[int], List[Row]]:
    """(the most rows a product call may take with every row keeping the bits
    it has alone, in both layouts the row-invariant verify uses: the
    narrowest of the census's product rows it rests on; the rows that set
    it), as treespec.backend.census.row_width; ``dtype``: that dtype's only."""
    return narrowest([r for r in rows if row_invariant(r) and r.op in PRODUCTS
                      and dtype in (None, r.dtype)])


def rest_width(rows: Sequence[Row], dtype: Optional[str] = None
               ) -> Tuple[Optional[int], List[Row]]:
    """The same for every other row the row-invariant verify rests on
    (attention's batch rows, norms, rope, recurrences): the most nodes the
    verify with chunked linears keeps exact."""
    return narrowest([r for r in rows if row_invariant(r) and r.op not in PRODUCTS
                      and dtype in (None, r.dtype)])


_LINEAR = (nn.Linear, nn.QuantizedLinear)
_EMBEDDING = (nn.Embedding, nn.QuantizedEmbedding)  # as_linear: a tied output head


class RowChunks:
    """Linear layers computed ``width`` rows a call at most (module docstring)."""

    def __init__(self, width: int):
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"width: the most rows a call keeps, an integer >= 1, got {width!r}")
        self.width = width

    def __repr__(self) -> str:
        return f"RowChunks({self.width})"

    def available(self) -> bool:
        """Any backend: the chunks are MLX's own calls."""
        return True

    def coverage(self, layer: nn.Module) -> Optional[str]:
        """None for a linear layer (or an embedding, whose ``as_linear`` is a
        tied output head), else why not."""
        return None if isinstance(layer, _LINEAR + _EMBEDDING) else \
            f"{type(layer).__name__} is not a linear layer"

    def linear_rows(self, layer: nn.Module, x: mx.array) -> mx.array:
        """``layer(x)`` (``layer.as_linear(x)`` for an embedding), in calls of
        at most ``width`` rows along the one leading axis longer than 1 (the
        nodes: on the batch axis, (T, 1, D), or the tokens axis, (1, T, D)),
        each call keeping that layout."""
        call = layer.as_linear if isinstance(layer, _EMBEDDING) else layer
        long = [a for a, n in enumerate(x.shape[:-1]) if n > 1]
        if len(long) > 1:
            raise ValueError(f"rows on more than one axis ({x.shape}): chunks keep one layout")
        if not long or x.shape[long[0]] <= self.width:
            return call(x)
        axis, n = long[0], x.shape[long[0]]
        index = [slice(None)] * x.ndim
        parts = []
        for start in range(0, n, self.width):
            index[axis] = slice(start, min(start + self.width, n))
            parts.append(call(x[tuple(index)]))
        return mx.concatenate(parts, axis=axis)
