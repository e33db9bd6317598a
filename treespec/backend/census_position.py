"""The census's ``position`` rows: whether a row's bits depend on its place
in an M-row call of a fixed M (or on the rows beside it), not only on M.

The census's ``tokens`` rows ask whether a row of an M-row call has the bits
of that row alone. A backend can fail that in two ways. Its kernel may be
picked by M only, so that every row of an M-row call gets the same bits
whatever else shares the call and wherever it sits: then a reference
computed at the verify's own width reproduces the verify's rows bit for bit
(treespec.evidence.same_width). Or a row's bits may also depend on its index
in the call (a micro-kernel's register blocks, a remainder loop), on its
neighbours, or, for attention, on where its visible keys sit among masked
ones (Debian's BLIS and OpenBLAS here, in float32: results/census/README.md):
then the same row placed differently in two M-row calls differs, and a
reference of the same width cannot be expected to reproduce the verify's
rows.

A ``position`` row measures that, at each M: one seeded probe row placed at
every index 0..M-1 of an M-row call, each time among fresh random
neighbours, and once more at index 0 among others, each placement's output
row against the first's, bit for bit. ``first_differs`` is the smallest M
where some placement differs (M=1 has no other place: identical).

Ops measured this way (on the token axis, as a verify lays out its nodes):
the products and the RMS norm (``_row_op``), and attention with a boolean
array mask (``sdpa+mask``, what a tree verify injects): the probe query over
the same keys, its own placed as a tree lays them out (scattered among
masked ones, ending at the query's index) against the contiguous layout of
a plain causal forward. RoPE is positional by design and the recurrent
kernels carry state along the tokens: neither is measured.

    position_census(model=None, dtypes=None, widths=WIDTHS, seed=0) -> [Row]
    position_width(rows, dtype=None) -> (M or None, the rows that limit it)
"""

from typing import List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np

from .census import WIDTHS, Row, _normal, _row_op, census, narrowest
from .census_inputs import cancelling, joined
from .census_shapes import HISTORY

__all__ = ["HOW", "MEASURES", "placed", "position_census", "position_rows", "position_width"]

HOW = "position"


def placed(fn, probe: mx.array, neighbours, axis: int = 1):
    """A ``pairs_at(M)`` for :func:`treespec.backend.census.measure`: ``probe``
    (one row along ``axis``) placed at every index j = 0..M-1 of an M-row call
    ``fn(x, j)`` among rows drawn by ``neighbours(M, k)`` (M-1 rows along
    ``axis``, fresh for each placement k), plus once more at index 0 among
    others; each placement's output row j against the first placement's."""

    def row(out: mx.array, j: int) -> mx.array:
        return out[(slice(None),) * axis + (slice(j, j + 1),)]

    def pairs_at(m: int):
        if m == 1:
            return []
        outs = []
        for k, j in enumerate(list(range(m)) + [0]):
            others = neighbours(m, k)
            cut = lambda a, b: others[(slice(None),) * axis + (slice(a, b),)]  # noqa: E731
            x = mx.concatenate([cut(0, j), probe, cut(j, m - 1)], axis=axis)
            outs.append(row(fn(x, j), j))
        return [(got, outs[0]) for got in outs[1:]]

    return pairs_at


def _drawn(rng, shape_of, dt):
    """neighbours(M, k): seeded rows drawn on first use, the same on every call."""
    drawn = {}

    def neighbours(m: int, k: int) -> mx.array:
        if (m, k) not in drawn:
            drawn[(m, k)] = _normal(rng, shape_of(m - 1), dt)
        return drawn[(m, k)]

    return neighbours


def _rows(spec, dt, rng, width, how):
    fn, n_in, at = _row_op(spec, dt, rng)
    probe = _normal(rng, (1, 1, n_in), dt)
    neighbours = _drawn(rng, lambda n: (1, n, n_in), dt)
    normal_draw = placed(lambda x, j: fn(x), probe, neighbours)
    if at is None:
        return normal_draw
    # in half precision the probe row's cancelling draw too (treespec.backend.census_inputs)
    return joined(normal_draw, placed(lambda x, j: fn(x), cancelling(probe, at), neighbours))


def _masked_attention(spec, dt, rng, width, how):
    """The probe query over the history's keys and p = (M + 1) // 2 keys of
    its own root path, as a tree verify lays them out: the path's keys at
    increasing slots s_0 < ... < s_{p-1} = j of the call's M, the probe the
    query at j, every other slot a neighbour's key the probe's mask hides.
    Placed contiguously (slots 0..p-1: a plain causal forward's layout), then
    at seeded scattered slots ending at each j = p-1..M-1, then contiguously
    again among other neighbours; the probe's row against the first."""
    h, kv, d = spec["heads"], spec["kv_heads"], spec["head_dim"]
    probe = _normal(rng, (1, h, 1, d), dt)
    hk, hv = (_normal(rng, (1, kv, HISTORY, d), dt) for _ in range(2))
    pk, pv = (_normal(rng, (1, kv, width, d), dt) for _ in range(2))

    def call(m: int, slots: list) -> mx.array:
        p, j = len(slots), slots[-1]
        ok, ov = (_normal(rng, (1, kv, m, d), dt) for _ in range(2))
        source = np.arange(p, p + m)  # slot -> column of [path keys, other keys]
        source[slots] = np.arange(p)
        take = mx.array(source)
        keys = mx.concatenate([hk, mx.concatenate([pk[:, :, :p], ok], axis=2)[:, :, take]], axis=2)
        values = mx.concatenate([hv, mx.concatenate([pv[:, :, :p], ov], axis=2)[:, :, take]], axis=2)
        q = _normal(rng, (1, h, m, d), dt)
        q = mx.concatenate([q[:, :, :j], probe, q[:, :, j + 1:]], axis=2)
        seen = np.arange(HISTORY + m)[None] < HISTORY + 1 + rng.integers(0, m, m)[:, None]
        seen[j] = False
        seen[j, :HISTORY] = True
        seen[j, HISTORY + np.array(slots)] = True
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=d ** -0.5,
                                                   mask=mx.array(seen))
        return out[:, :, j:j + 1]

    def pairs_at(m: int):
        if m == 1:
            return []
        p = (m + 1) // 2
        first = call(m, list(range(p)))
        scattered = [sorted(rng.choice(j, p - 1, replace=False).tolist()) + [j]
                     for j in range(p - 1, m)]
        return [(call(m, slots), first) for slots in scattered + [list(range(p))]]

    return pairs_at


# op of a Spec -> its position rows (the census's MEASURES format)
MEASURES = {
    "matmul": [("matmul", HOW, _rows)],
    "addmm": [("addmm", HOW, _rows)],
    "quantized_matmul": [("quantized_matmul", HOW, _rows)],
    "rms_norm": [("rms_norm", HOW, _rows)],
    "sdpa": [("sdpa+mask", HOW, _masked_attention)],
}


def position_census(model=None, dtypes: Optional[Sequence[str]] = None,
                    widths: Sequence[int] = WIDTHS, seed: int = 0) -> List[Row]:
    """The ``position`` rows of the default shapes or of ``model``'s own,
    as :func:`treespec.backend.census.census` measures its rows (same
    arguments, same seeding, same checks)."""
    return census(model, dtypes, widths, seed, measures=MEASURES)


def position_rows(rows: Sequence[Row], dtype: Optional[str] = None) -> List[Row]:
    """The ``position`` rows of ``rows`` (of ``dtype`` where given)."""
    return [r for r in rows if r.how == HOW and dtype in (None, r.dtype)]


def position_width(rows: Sequence[Row],
                   dtype: Optional[str] = None) -> Tuple[Optional[int], List[Row]]:
    """(the largest M up to which every ``position`` row is identical at
    every measured width, the rows that set it): up to that M a row of an
    M-row call has bits that depend on M alone, so a reference computed at
    the same width may reproduce it bit for bit. None when no position row
    was measured; 0 when one could not run. ``dtype``: that dtype's rows only."""
    return narrowest(position_rows(rows, dtype))
