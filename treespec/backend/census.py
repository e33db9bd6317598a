"""A census of the running backend: which ops give a row of an M-row call
bit-identical to that row computed alone, and from which M they differ.

Every exactness claim of treespec rests on this one property of the backend.
A tree verify computes n nodes in one forward of width n (attention layers:
n token rows; recurrent layers: each depth's nodes as one batch of T=1 rows)
where classic decoding computes each token alone, so a node's logits equal
its root path's one-token steps only where every op of the forward gives a
row the same bits whatever else shares its call. A BLAS, a GPU kernel or a
compiler may pick its tiling and summation order by M; nothing but a
measurement says where (docs/numerics.md#the-backend-census). The census
measures it op by op, on MLX alone, with seeded random inputs (half-precision
products also with a cancelling draw: treespec.backend.census_inputs):

- ``tokens``: an M-row call (rows along the token axis: matmul, quantized
  matmul, RMS norm; RoPE at positions offset+i; attention's M queries)
  against each row alone (RoPE at its own offset; attention's query alone
  over the keys it may see, as a one-token decoding step sees them);
- ``batch``: M independent rows on the batch axis of one T=1 call against each
  alone, how the tree-aware recurrence runs a depth's nodes (and how per-node
  RoPE runs, with a vector of offsets);
- ``steps``: one T=M call of a recurrent kernel or conv against M chained T=1
  calls, the state carried (outputs and final state compared);
- ``position`` (treespec.backend.census_position, its own rows): one row
  placed at different indices of M-row calls of one M, among other rows.

Rows are compared bit for bit; ``max_diff`` is the largest |difference| seen.
Shapes: census_shapes' DEFAULT_SPECS or a model's own (``model_specs``).
"""

import zlib
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np
from mlx_lm.models.gated_delta import gated_delta_update
from mlx_lm.models.ssm import ssm_update

from .census_inputs import cancel_at, cancelling, equal_columns, joined
from .census_inputs import normal as _normal
from .census_shapes import DEFAULT_SPECS, HISTORY, Spec, model_dtype, model_specs

__all__ = ["DTYPES", "WIDTHS", "Row", "against_alone", "against_steps", "census", "format_table",
           "inexact", "measure", "measure_row", "measure_rows", "plan", "row_invariant",
           "row_width", "summary", "to_json", "widths_text"]

DTYPES = ("float32", "bfloat16", "float16")
WIDTHS = tuple(range(1, 17))
_UNSIGNED = {2: mx.uint16, 4: mx.uint32, 8: mx.uint64}


@dataclass(frozen=True)
class Row:
    """One op, one way of sharing a call (``how``), one dtype, one shape.

    op:            "matmul", "addmm" (with a bias), "quantized_matmul", "sdpa" (no mask),
                   "sdpa+causal" (mlx-lm's string mask), "sdpa+mask" (a boolean array mask,
                   what a tree verify injects), "sdpa+additive", "rms_norm", "rope", "conv1d",
                   "gated_delta", "ssm_update" (mamba2's), "ssm_step" (mamba's)
    dtype:         "float32" | "bfloat16" | "float16"
    shape:         a label: "64->128" (in->out), "q4 g64 512->512", "heads 4/2 dim 32 keys 24+M"
    widths:        the M measured, ascending
    first_differs: the smallest M where some row differs from the row alone; None: identical
                   at every M measured
    max_diff:      the largest |difference| seen (0.0 where identical)
    how:           "tokens", "batch", "steps" (the module docstring) or "position"
                   (treespec.backend.census_position)
    error:         the first line of what the op raised, if it could not run here
    """

    op: str
    dtype: str
    shape: str
    widths: tuple
    first_differs: Optional[int]
    max_diff: float
    how: str = "tokens"
    error: Optional[str] = None

    @property
    def verdict(self) -> str:
        if self.error:
            return "could not run"
        if self.first_differs is None:
            return f"identical up to {self.widths[-1]}"
        return f"differs from {self.first_differs}"


def inexact(rows: Sequence[Row]) -> List[Row]:
    """The rows with ``first_differs`` not None."""
    return [r for r in rows if r.first_differs is not None]


# The comparison.

def _bits(a: mx.array) -> mx.array:
    return a.view(_UNSIGNED[a.dtype.size]) if mx.issubdtype(a.dtype, mx.floating) else a


def _differs(got: mx.array, want: mx.array) -> Optional[float]:
    """None where ``got`` and ``want`` hold the same bits, else max |got - want|
    (inf for a shape mismatch or a NaN). Bits, not values: -0.0 is not 0.0."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return float("inf")
    if mx.array_equal(_bits(got), _bits(want)).item():
        return None
    d = mx.max(mx.abs(got.astype(mx.float32) - want.astype(mx.float32))).item()
    return float("inf") if d != d else float(d)


Pairs = Callable[[int], Sequence[Tuple[mx.array, mx.array]]]


def measure(pairs_at: Pairs, widths: Sequence[int]) -> Tuple[Optional[int], float]:
    """(first M where some pair differs or None, largest |difference|) over
    ``widths`` (ascending); ``pairs_at(M)`` gives the (M-row call's result,
    the rows computed alone) pairs at width M."""
    first, worst = None, 0.0
    for m in widths:
        pairs = list(pairs_at(m))
        mx.eval(*(a for pair in pairs for a in pair))
        for got, want in pairs:
            d = _differs(got, want)
            if d is not None:
                first = m if first is None else first
                worst = max(worst, d)
    return first, worst


def _cut(x: mx.array, start: int, stop: int, axis: int) -> mx.array:
    return x[(slice(None),) * axis + (slice(start, stop),)]


def _tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def against_alone(batched: Callable, alone: Callable, axis: int) -> Pairs:
    """Pairs of ``batched(M)`` (an array, or a tuple of arrays, with M rows
    along ``axis``) against rows ``alone(0..M-1)`` concatenated; each row
    alone is computed once."""
    rows: Dict[int, tuple] = {}

    def pairs_at(m: int):
        for i in range(m):
            if i not in rows:
                rows[i] = _tuple(alone(i))
                mx.eval(*rows[i])
        got = _tuple(batched(m))
        want = [mx.concatenate([rows[i][j] for i in range(m)], axis=axis) for j in range(len(got))]
        return list(zip(got, want))

    return pairs_at


def against_steps(step: Callable, width: int, first_state) -> Pairs:
    """Pairs of a T=M call against M chained T=1 calls: the outputs (T along
    axis 1) and the final state. ``step(start, stop, state)`` -> (outputs of
    inputs start..stop-1 from ``state``, the state after them); each chained
    step is computed once."""
    chain: List[tuple] = []

    def pairs_at(m: int):
        while len(chain) < m:
            y, s = step(len(chain), len(chain) + 1, chain[-1][1] if chain else first_state)
            mx.eval(y, s)
            chain.append((y, s))
        y, s = step(0, m, first_state)
        return [(y, mx.concatenate([c[0] for c in chain[:m]], axis=1)), (s, chain[m - 1][1])]

    return pairs_at


def _sliced(fn: Callable, x: mx.array, axis: int) -> Pairs:
    return against_alone(lambda m: fn(_cut(x, 0, m, axis)),
                         lambda i: fn(_cut(x, i, i + 1, axis)), axis)


def measure_rows(fn: Callable, x: mx.array, widths: Sequence[int],
                 axis: int = 0) -> Tuple[Optional[int], float]:
    """The census's comparison for an op that maps rows to rows: ``fn`` of
    the first M rows of ``x`` (along ``axis``) against ``fn`` of each row
    alone, at every M of ``widths``. Returns (first differing M or None,
    largest |difference|)."""
    return measure(_sliced(fn, x, axis), widths)


# ---------------------------------------------------------------------------
# The ops: each builder gets (spec, dtype, rng, widest M, how) and returns pairs_at.


def _row_op(spec: Spec, dt, rng) -> Tuple[Callable, int, Optional[Tuple[int, int]]]:
    """(a function of rows, its input width, where its cancelling draw puts
    +A and -A or None: treespec.backend.census_inputs) for products and norms."""
    if spec.op == "rms_norm":
        w = 1.0 + _normal(rng, (spec["dim"],), dt, 0.1)
        return (lambda x: mx.fast.rms_norm(x, w, spec["eps"])), spec["dim"], None
    n_in, n_out = spec["n_in"], spec["n_out"]
    quantized = spec.op == "quantized_matmul"
    at = cancel_at(dt, n_in, spec["group"] if quantized else None)
    w = equal_columns(_normal(rng, (n_out, n_in), dt, n_in ** -0.5), at)
    if spec.op == "addmm":
        b = _normal(rng, (n_out,), dt)
        return (lambda x: mx.addmm(b, x, w.T)), n_in, at
    if quantized:
        mode, group, bits = spec["mode"], spec["group"], spec["bits"]
        wq, scales, *biases = mx.quantize(w, group, bits, mode=mode)
        biases = biases[0] if biases else None
        return (lambda x: mx.quantized_matmul(x, wq, scales=scales, biases=biases, transpose=True,
                                              group_size=group, bits=bits, mode=mode)), n_in, at
    return (lambda x: x @ w.T), n_in, at


def _rows(spec, dt, rng, width, how):
    fn, n_in, at = _row_op(spec, dt, rng)
    axis = 1 if how == "tokens" else 0
    x = _normal(rng, (1, width, n_in) if how == "tokens" else (width, 1, n_in), dt)
    if at is None:
        return _sliced(fn, x, axis)
    return joined(_sliced(fn, x, axis), _sliced(fn, cancelling(x, at), axis))


def _rope(spec, dt, rng, width, how):
    dims, base = spec["dims"], spec["base"]
    fn = spec.module  # an nn.Module is a dict: an empty one is falsy, hence "is None"
    if fn is None:
        fn = lambda x, offset: mx.fast.rope(  # noqa: E731
            x, dims, traditional=False, base=base, scale=1.0, offset=offset)
    if how == "tokens":  # positions HISTORY + i along the token axis; alone at its own offset
        x = _normal(rng, (1, 4, width, spec["head_dim"]), dt)
        return against_alone(lambda m: fn(x[:, :, :m], offset=HISTORY),
                             lambda i: fn(x[:, :, i:i + 1], offset=HISTORY + i), 2)
    # batch: tokens on the batch axis with a vector of offsets (per-node RoPE)
    x = _normal(rng, (width, 4, 1, spec["head_dim"]), dt)
    return against_alone(lambda m: fn(x[:m], offset=mx.arange(HISTORY, HISTORY + m)),
                         lambda i: fn(x[i:i + 1], offset=HISTORY + i), 0)


def _attention(variant: str):
    def build(spec, dt, rng, width, how):
        h, kv, d = spec["heads"], spec["kv_heads"], spec["head_dim"]
        q = _normal(rng, (1, h, width, d), dt)
        k, v = (_normal(rng, (1, kv, HISTORY + width, d), dt) for _ in range(2))

        def sdpa(q, keys, mask=None):
            return mx.fast.scaled_dot_product_attention(
                q, k[:, :, :keys], v[:, :, :keys], scale=d ** -0.5, mask=mask)

        if variant == "":  # M queries over HISTORY + M keys, no mask; each alone over the same
            return lambda m: [(sdpa(q[:, :, :m], HISTORY + m), mx.concatenate(
                [sdpa(q[:, :, i:i + 1], HISTORY + m) for i in range(m)], axis=2))]

        def mask(m):
            if variant == "causal":
                return "causal"
            seen = mx.arange(HISTORY + m)[None] <= HISTORY + mx.arange(m)[:, None]
            if variant == "mask":
                return seen
            return mx.where(seen, mx.array(0, dt), mx.array(mx.finfo(dt).min, dt))

        # each query alone over the keys it may see: a one-token decoding step
        return against_alone(lambda m: sdpa(q[:, :, :m], HISTORY + m, mask(m)),
                             lambda i: sdpa(q[:, :, i:i + 1], HISTORY + i + 1), 2)

    return build


def _attention_rows(spec, dt, rng, width, how):
    """``batch``: M batch rows, each one query over keys of its own (the
    same count), against each row alone: how the row-invariant verify runs
    one depth of a tree (treespec.verify.depth_steps)."""
    h, kv, d = spec["heads"], spec["kv_heads"], spec["head_dim"]
    q = _normal(rng, (width, h, 1, d), dt)
    k, v = (_normal(rng, (width, kv, HISTORY + 1, d), dt) for _ in range(2))

    def sdpa(rows: slice):
        return mx.fast.scaled_dot_product_attention(q[rows], k[rows], v[rows], scale=d ** -0.5)

    return against_alone(lambda m: sdpa(slice(0, m)), lambda i: sdpa(slice(i, i + 1)), 0)


def _conv(spec, dt, rng, width, how):
    c, out, k, g = spec["channels"], spec["channels_out"], spec["kernel"], spec["groups"]
    w = _normal(rng, (out, k, c // g), dt, k ** -0.5)
    fn = lambda x: mx.conv1d(x, w, groups=g)  # noqa: E731
    if how == "steps":  # a window of k-1 kept inputs, then the new ones
        x = _normal(rng, (1, k - 1 + width, c), dt)
        return against_alone(lambda m: fn(x[:, :k - 1 + m]), lambda i: fn(x[:, i:i + k]), 1)
    x = _normal(rng, (width, k, c), dt)
    return against_alone(lambda m: fn(x[:m]), lambda i: fn(x[i:i + 1]), 0)


def _unit(rng, shape, scale: float) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True) * scale


def _gated_delta(spec, dt, rng, width, how):
    hk, hv, dk, dv = spec["k_heads"], spec["v_heads"], spec["k_dim"], spec["v_dim"]
    b, t = (1, width) if how == "steps" else (width, 1)
    q = mx.array(_unit(rng, (b, t, hk, dk), dk ** -0.5)).astype(dt)  # as normalize_qk leaves them
    k = mx.array(_unit(rng, (b, t, hk, dk), 1.0)).astype(dt)
    v = _normal(rng, (b, t, hv, dv), dt)
    a, beta = _normal(rng, (b, t, hv), dt), _normal(rng, (b, t, hv), dt)
    a_log = mx.array(np.log(rng.uniform(1, 16, hv)).astype(np.float32)).astype(dt)
    dt_bias = _normal(rng, (hv,), dt, 0.5)
    state = _normal(rng, (b, hv, dv, dk), mx.float32, 0.1)

    def call(sel, s):
        return gated_delta_update(q[sel], k[sel], v[sel], a[sel], beta[sel], a_log, dt_bias, s)

    if how == "steps":
        return against_steps(lambda i, j, s: call((slice(None), slice(i, j)), s), width, state)
    return against_alone(lambda m: call(slice(0, m), state[:m]),
                         lambda i: call(slice(i, i + 1), state[i:i + 1]), 0)


def _ssm_update(spec, dt, rng, width, how):
    h, p, n, g = spec["heads"], spec["head_dim"], spec["state"], spec["groups"]
    b, t = (1, width) if how == "steps" else (width, 1)
    x = _normal(rng, (b, t, h, p), dt)
    bb, cc = _normal(rng, (b, t, g, n), dt), _normal(rng, (b, t, g, n), dt)
    dtv = _normal(rng, (b, t, h), dt)
    a_log = mx.array(np.log(np.arange(1, h + 1)).astype(np.float32))
    d, dt_bias = _normal(rng, (h,), dt), _normal(rng, (h,), dt, 0.5)
    state = _normal(rng, (b, h, p, n), dt, 0.1)

    def call(sel, s):
        return ssm_update(x[sel], a_log, bb[sel], cc[sel], d, dtv[sel], dt_bias, s, (0.001, 100.0))

    if how == "steps":
        return against_steps(lambda i, j, s: call((slice(None), slice(i, j)), s), width, state)
    return against_alone(lambda m: call(slice(0, m), state[:m]),
                         lambda i: call(slice(i, i + 1), state[i:i + 1]), 0)


def _ssm_step(spec, dt, rng, width, how):
    block = spec.module
    x = _normal(rng, (width, spec["inner"]), dt)
    state = _normal(rng, (width, spec["inner"], spec["state"]), dt, 0.1)
    a = -mx.exp(block.A_log)
    return against_alone(lambda m: block.ssm_step(x[:m], a, state[:m]),
                         lambda i: block.ssm_step(x[i:i + 1], a, state[i:i + 1]), 0)


# op of a Spec -> the rows it gives: (op name of the row, how, builder)
MEASURES = {
    "matmul": [("matmul", "tokens", _rows), ("matmul", "batch", _rows)],
    "addmm": [("addmm", "tokens", _rows), ("addmm", "batch", _rows)],
    "quantized_matmul": [("quantized_matmul", "tokens", _rows),
                         ("quantized_matmul", "batch", _rows)],
    "rms_norm": [("rms_norm", "tokens", _rows), ("rms_norm", "batch", _rows)],
    "rope": [("rope", "tokens", _rope), ("rope", "batch", _rope)],
    "sdpa": [("sdpa", "tokens", _attention("")), ("sdpa+causal", "tokens", _attention("causal")),
             ("sdpa+mask", "tokens", _attention("mask")),
             ("sdpa+additive", "tokens", _attention("additive")),
             ("sdpa", "batch", _attention_rows)],
    "conv1d": [("conv1d", "steps", _conv), ("conv1d", "batch", _conv)],
    "gated_delta": [("gated_delta", "steps", _gated_delta), ("gated_delta", "batch", _gated_delta)],
    "ssm_update": [("ssm_update", "steps", _ssm_update), ("ssm_update", "batch", _ssm_update)],
    "ssm_step": [("ssm_step", "batch", _ssm_step)],
}


def checked_widths(widths) -> tuple:
    try:
        ws = tuple(sorted({int(w) for w in widths}))
        whole = all(w == int(w) and not isinstance(w, bool) for w in widths)
    except (TypeError, ValueError):
        ws, whole = (), False
    if not ws or ws[0] < 1 or not whole:
        raise ValueError(f"widths must be integers >= 1, got {widths!r}")
    return ws


def checked_dtypes(dtypes) -> tuple:
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise ValueError(f"dtypes must be among {DTYPES}, got {tuple(dtypes)!r}")
    return tuple(dict.fromkeys(dtypes))


Planned = Tuple[Spec, str, str, str, Callable]  # (spec, op, how, dtype, build)


def plan(model=None, dtypes: Optional[Sequence[str]] = None,
         measures: Optional[dict] = None) -> List[Planned]:
    """The rows :func:`census` measures, in its order (its arguments)."""
    if dtypes is None:
        dtypes = DTYPES if model is None else (model_dtype(model),)
    dtypes = checked_dtypes(dtypes)
    specs = DEFAULT_SPECS if model is None else model_specs(model)
    return [(spec, op, how, name, build) for spec in specs
            for op, how, build in (MEASURES if measures is None else measures).get(spec.op, ())
            for name in dtypes]


def measure_row(planned: Planned, widths: tuple, seed: int = 0) -> Row:
    """One planned row at ``widths`` (checked, ascending), its inputs seeded by
    ``seed`` and the row's op, shape, how and dtype (reproducible); an op that
    raises is a row that could not run."""
    spec, op, how, name, build = planned
    rng = np.random.default_rng([seed, zlib.crc32(f"{op}|{spec.shape}|{how}|{name}".encode())])
    try:
        first, worst = measure(build(spec, getattr(mx, name), rng, widths[-1], how), widths)
    except (RuntimeError, ValueError, TypeError) as e:
        msg = (str(e).splitlines() or [""])[0][:160]
        return Row(op, name, spec.shape, widths, None, 0.0, how, f"{type(e).__name__}: {msg}")
    return Row(op, name, spec.shape, widths, first, worst, how)


def census(model=None, dtypes: Optional[Sequence[str]] = None, widths: Sequence[int] = WIDTHS,
           seed: int = 0, measures: Optional[dict] = None) -> List[Row]:
    """Every row of :func:`plan` measured by :func:`measure_row` on
    ``mx.default_device()``: the default shapes (``model=None``) or
    ``model``'s own, at ``dtypes`` (None: all three, or the model's own),
    every M of ``widths``. ``measures``: the rows per op (default
    :data:`MEASURES`; treespec.backend.census_position's). Where a kernel may
    crash the process: treespec.backend.census_child."""
    ws = checked_widths(widths)
    return [measure_row(p, ws, seed) for p in plan(model, dtypes, measures)]

# ---------------------------------------------------------------------------
# Reading a census (no device code).


def row_invariant(row: Row) -> bool:
    """Whether the row-invariant verify rests on ``row``'s property: every
    ``batch`` row (its attention, projections, rope and recurrence run the
    nodes on the batch axis), and the ``tokens`` rows of products and norms
    (the rest of the layer runs over the T nodes); not the attention's or
    the rope's ``tokens`` rows (the flat verify's), nor ``steps``."""
    return row.how == "batch" or (row.how == "tokens" and not row.op.startswith(("sdpa", "rope")))


def row_width(rows: Sequence[Row], dtype: Optional[str] = None) -> Tuple[Optional[int], List[Row]]:
    """(the largest M at which every row the row-invariant verify rests on
    (:func:`row_invariant`) is identical at every measured width up to M,
    the rows that set it). None when no such row was measured; 0 when one
    could not run. A tree of at most that many nodes verifies bit-identically
    to one-token steps on this backend, if the rest of the model is what the
    census measured. ``dtype``: that dtype's rows only (None: all)."""
    return narrowest([r for r in rows if row_invariant(r) and dtype in (None, r.dtype)])


def narrowest(used: Sequence[Row]) -> Tuple[Optional[int], List[Row]]:
    """(the largest M up to which every row of ``used`` is identical, the
    rows that set it): None for no rows, 0 where one could not run."""
    if not used:
        return None, []

    def cap(r: Row) -> int:
        if r.error:
            return 0
        return r.widths[-1] if r.first_differs is None else r.first_differs - 1

    width = min(cap(r) for r in used)
    return width, [r for r in used if cap(r) == width and (r.error or r.first_differs is not None)]


def widths_text(widths: Sequence[int]) -> str:
    """(1, 2, ..., 16) -> "1..16"; (1, 2, 4, 8) -> "1,2,4,8"; runs of 3+ as LO..HI."""
    ws, parts, i = list(widths), [], 0
    while i < len(ws):
        j = i
        while j + 1 < len(ws) and ws[j + 1] == ws[j] + 1:
            j += 1
        parts.append(f"{ws[i]}..{ws[j]}" if j - i >= 2 else ",".join(map(str, ws[i:j + 1])))
        i = j + 1
    return ",".join(parts)


def format_table(rows: Sequence[Row]) -> str:
    """The census as a text table, one line a row."""
    head = ("op", "how", "dtype", "shape", "widths", "result", "max |diff|")
    body = [(r.op, r.how, r.dtype, r.shape, widths_text(r.widths), r.verdict,
             r.error if r.error else (f"{r.max_diff:.3g}" if r.max_diff else "0")) for r in rows]
    size = [max(len(str(c[i])) for c in [head] + body) for i in range(len(head))]
    line = lambda cells: "  ".join(f"{c:<{n}}" for c, n in zip(cells, size)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * n for n in size])] + [line(c) for c in body])


def summary(rows: Sequence[Row]) -> str:
    """One line: which ops differ from which M (the smallest over the op's
    shapes, per how and dtype), or that none does; ops that could not run are
    named."""
    first: Dict[tuple, Dict[str, int]] = {}
    for r in inexact(rows):
        at = first.setdefault((r.op, r.how), {})
        at[r.dtype] = min(at.get(r.dtype, r.first_differs), r.first_differs)
    parts = [f"{op} {how}: " + ", ".join(f"{d} from {m}" for d, m in at.items())
             for (op, how), at in first.items()]
    failed = sorted({f"{r.op} {r.dtype}" for r in rows if r.error})
    text = "differs: " + "; ".join(parts) if parts else "every row identical at every M measured"
    return text + (f"; could not run: {', '.join(failed)}" if failed else "")


def to_json(rows: Sequence[Row]) -> List[dict]:
    return [{**asdict(r), "widths": list(r.widths)} for r in rows]
