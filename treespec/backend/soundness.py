"""Does this backend compute a model's quantized products soundly at the
widths a verify multiplies with? A precondition of every numeric verdict,
measured on MLX alone (no treespec code, no mlx-lm forward).

An envelope (treespec.evidence.numerics) is the backend's dependence on the number of
tokens, and presumes the backend computes one product the same way every
time. MLX 0.32.4's CUDA backend does not, for the small quantized matrices
of the suite's zoo models: the same ``quantized_matmul`` call returns
different values, or inf, from one call to the next at 5 rows of a 64-wide
4-bit matrix (results/h200-exactness/). There no comparison can separate a
tree defect from the kernel, and what the suites would report (an infinite
difference "where the backend is bit-exact") would be the kernel's fault,
not treespec's. So a model whose products fail this probe gets no verdict:
inconclusive, with the fault named (treespec.evidence.verdicts.judge), and the gate
declines speculation on it (treespec.evidence.gate.decide).

A product is **sound** at ``rows`` when ``REPEATS`` identical calls, each
evaluated on its own, raise nothing, are bit-identical to each other, are
finite, and lie within ``SLACK`` x the worst-case rounding of the matrix of
its own dequantized weights (|x| @ |W|^T per element: what any summation
order of the dot products in any of MLX's float dtypes stays well inside).
The probe uses the model's own packed weights, scales and biases, one module
per distinct (shape, bits, group, mode, dtype). What it does not probe: a
quantized KV cache's attention products (``quantized_scaled_dot_product_attention``);
where those raise, the gate's probe declines with the error, and the suites
attribute the error to MLX (suites/backend.py).
"""

from dataclasses import dataclass
from typing import Dict, Iterable, List, Tuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np

__all__ = ["REPEATS", "ROWS", "SLACK", "Fault", "faults", "holds_scales", "quantized_modules"]

# Widths probed by default, in the order probed (the first fault ends the
# probe): 5 rows first, where the H200 showed its faults, then the suite's
# tree and chain widths, an EAGLE-sized tree's 33 (past 32 rows MLX's CPU
# switches GEMM paths), one row last. On CUDA a new shape can need a new
# kernel, 15-50 s of compiling each on the H200
# (results/h200-exactness/kernel-compiles-qmm.txt), so the list is short.
ROWS = (5, 2, 9, 13, 17, 33, 1)
REPEATS = 3
SLACK = 2.0 ** -5  # x sum |x||w|: half precision's own rounding is 2^-8 of it


@dataclass(frozen=True)
class Fault:
    """One unsound product: where, and what was wrong."""

    shape: str
    what: str

    def __str__(self) -> str:
        return f"quantized_matmul {self.shape}: {self.what}" if self.shape else self.what


def quantized_modules(model: nn.Module) -> List[nn.Module]:
    """One quantized module (QuantizedLinear, QuantizedEmbedding, or any
    module holding packed ``weight``/``scales`` with ``bits`` and
    ``group_size``) per distinct (weight shape, bits, group, mode, dtype)."""
    out: Dict[tuple, nn.Module] = {}
    for _, m in model.named_modules():
        if not hasattr(m, "bits") or not hasattr(m, "group_size") or "scales" not in m:
            continue
        w, s = m["weight"], m["scales"]
        if w.ndim != 2:  # stacked experts run through gather_qmm, not probed here
            continue
        key = (tuple(w.shape), m.bits, m.group_size, getattr(m, "mode", "affine"), s.dtype)
        out.setdefault(key, m)
    return list(out.values())


def holds_scales(params) -> bool:
    """Whether some parameter (``tree_flatten(model.parameters())``) is a
    ``scales`` array. Every quantized module holds one (QuantizedLinear,
    QuantizedEmbedding, and what :func:`quantized_modules` finds), so where
    none is there is no quantized module to walk the model for: a walk of
    the modules costs more than the rest of a decode call's gate."""
    return any(k == "scales" or k.endswith(".scales") for k, _ in params)


def _product(m, x):
    return mx.quantized_matmul(x, m["weight"], scales=m["scales"], biases=m.get("biases"),
                               transpose=True, group_size=m.group_size, bits=m.bits,
                               mode=getattr(m, "mode", "affine"))


def host(a: mx.array) -> np.ndarray:
    """``a`` in float32 on the host, converted there: a device cast compiles
    one more kernel for every new shape on CUDA (about a second each on the
    H200), and the probe meets many shapes."""
    if a.dtype == mx.bfloat16:  # numpy has no bfloat16: its bits are float32's top half
        return (np.array(a.view(mx.uint16)).astype(np.uint32) << 16).view(np.float32)
    return np.array(a).astype(np.float32)


_DEQUANTIZED: Dict[int, np.ndarray] = {}


def _dequantized(m) -> np.ndarray:
    key = id(m["weight"])
    if key not in _DEQUANTIZED:
        _DEQUANTIZED.clear()  # one module at a time: the probe walks them in turn
        _DEQUANTIZED[key] = host(mx.dequantize(
            m["weight"], m["scales"], m.get("biases"), group_size=m.group_size, bits=m.bits,
            mode=getattr(m, "mode", "affine"))).astype(np.float64)
    return _DEQUANTIZED[key]


def _probe(m, rows: int) -> str:
    """What is wrong with ``m``'s product at ``rows`` rows ('' if sound).
    Only the product runs on the device; the inputs are quarters in [-2, 2]
    (exact in every float dtype) and every check runs on the host."""
    w = _dequantized(m)
    xs = np.random.default_rng(rows).integers(-8, 9, (1, rows, w.shape[1])) / 4.0
    x = mx.array(xs.astype(np.float32), dtype=m["scales"].dtype)
    runs = []
    for _ in range(REPEATS):
        try:
            y = _product(m, x)
            mx.eval(y)
        except (RuntimeError, ValueError) as e:
            return f"raises {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        runs.append(host(y).astype(np.float64))
    if not all(np.isfinite(r).all() for r in runs):
        return f"not finite ({REPEATS} calls on finite inputs)"
    spread = max(float(np.abs(runs[0] - r).max()) for r in runs[1:])
    if spread:
        return f"not repeatable: identical calls differ by up to {spread:.3g}"
    err = np.abs(runs[0] - xs @ w.T)
    if (err > SLACK * (np.abs(xs) @ np.abs(w).T)).any():
        return (f"off its own dequantized product by up to {float(err.max()):.3g}, beyond "
                f"{SLACK:g} x sum |x||w| (any summation order's rounding stays far inside)")
    return ""


_MEMO: Dict[tuple, str] = {}


def _shape(m, rows: int) -> str:
    w = m["weight"]
    cols = w.shape[1] * 32 // m.bits
    mode = getattr(m, "mode", "affine")
    return (f"at {rows} rows x {cols} -> {w.shape[0]}, {m.bits}-bit group {m.group_size} "
            f"{mode}, {str(m['scales'].dtype).removeprefix('mlx.core.')}")


def faults(model: nn.Module, rows: Iterable[int] = ROWS, every: bool = False) -> Tuple[Fault, ...]:
    """The unsound products of ``model``'s quantized modules at ``rows``
    (in that order): the first found, or with ``every`` all of them; () for
    a model with none, or on a sound backend. Memoized per (device, weight
    shape, bits, group, mode, dtype, rows): a property of the backend's
    kernel at that shape."""
    found: List[Fault] = []
    device = str(mx.default_device())
    order = list(dict.fromkeys(int(r) for r in rows if int(r) >= 1))
    modules = quantized_modules(model)
    for r in order:
        for m in modules:
            key = (device, tuple(m["weight"].shape), m.bits, m.group_size,
                   getattr(m, "mode", "affine"), str(m["scales"].dtype), r)
            if key not in _MEMO:
                _MEMO[key] = _probe(m, r)
            if _MEMO[key]:
                found.append(Fault(_shape(m, r), _MEMO[key]))
                if not every:
                    return tuple(found)
    return tuple(found)
