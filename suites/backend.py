"""Errors that are the backend's, not treespec's (loaded by the root
conftest.py): a test that fails because MLX has no kernel for a product it
needs is reported as not run on this backend, with the error, and only when
MLX's primitive alone, called with nothing of treespec or mlx-lm around it,
raises the same. Anything else stays a failure.

Measured on the H200 (MLX 0.32.4 CUDA): ``quantized_matmul`` has no kernel
for the products of mlx-lm's quantized-KV attention at the zoo's sizes
(``No implementation for problem shape: 5x8x32x4, transpose: true,
activation: float32, bits: 4, group size: 32``), even for one query row, so
mlx-lm's own ``generate`` with ``kv_bits`` fails there too.
"""

import re
from typing import Optional

import mlx.core as mx
import pytest

from suites.verdict import BACKEND_GAP, exact_backend, PROPERTY
from treespec.evidence import numerics

_NO_KERNEL = re.compile(
    r"\[quantized_matmul\] No implementation for problem shape: (\d+)x(\d+)x(\d+)x(\d+), "
    r"transpose: (true|false), activation: (\w+), bits: (\d+), group size: (\d+), "
    r"mode: \"(\w+)\"")


STEP = 256  # mlx-lm's QuantizedKVCache grows its buffers by this many rows


def _layouts(rows: int, cols: int, inner: int, batch: int, transpose: bool):
    """(x shape, w buffer shape, rows of the buffer used) for every way the
    problem shape can reach the kernel: a plain batch; w a slice of a cache
    buffer (as QuantizedKVCache hands out its keys); and mlx-lm's grouped-query
    broadcast (queries as kv heads x repeats, keys with a unit repeat axis)."""
    buffer = -(-cols // STEP) * STEP
    w = (lambda lead, n: (*lead, n, inner)) if transpose else (lambda lead, n: (*lead, inner, n))
    yield (batch, rows, inner), w((batch,), cols), cols
    yield (batch, rows, inner), w((batch,), buffer), cols
    for kv in (d for d in range(1, batch + 1) if batch % d == 0):
        yield (1, kv, batch // kv, rows, inner), w((1, kv, 1), buffer), cols


def reproduce(message: str) -> Optional[str]:
    """MLX's own error when ``quantized_matmul`` alone, at the problem shape
    ``message`` names (rows x cols x inner x batch) in one of the layouts it
    can arrive in (:func:`_layouts`), raises it too; None when the message
    names no such shape or the primitive alone runs in every layout."""
    m = _NO_KERNEL.search(message)
    if m is None:
        return None
    rows, cols, inner, batch, transpose, act, bits, group, mode = m.groups()
    rows, cols, inner, batch, bits, group = map(int, (rows, cols, inner, batch, bits, group))
    dtype = getattr(mx, act, None)
    if dtype is None:
        return None
    transpose = transpose == "true"
    key = mx.random.key(0)
    for xs, ws, used in _layouts(rows, cols, inner, batch, transpose):
        x = mx.random.normal(xs, key=key).astype(dtype)
        try:
            q = mx.quantize(mx.random.normal(ws, key=key).astype(dtype), group_size=group,
                            bits=bits, mode=mode)
            # the used rows of the buffer: a strided view, as a cache's keys are
            q = [a[..., :used, :] if transpose else a for a in q]
            mx.eval(x, q)
            mx.eval(mx.quantized_matmul(x, *q, transpose=transpose, group_size=group,
                                        bits=bits, mode=mode))
        except RuntimeError as e:
            if "No implementation" in str(e):
                return str(e).splitlines()[0]
    return None


def gap_reason(message: str) -> Optional[str]:
    """Why a failure with MLX's error ``message`` is the backend's (a kernel
    MLX lacks, reproduced by the primitive alone), or None: the message names
    no missing kernel, the primitive alone runs, or the census measures the
    backend exact (there a missing kernel is a regression: it stays a failure)."""
    if exact_backend():
        return None
    error = reproduce(message)
    if error is None:
        return None
    return (f"not run on this backend: MLX's quantized_matmul alone raises '{error}' "
            "(reproduced without treespec or mlx-lm), a kernel this test's forwards need")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or call.excinfo is None or not report.failed:
        return
    if not isinstance(call.excinfo.value, RuntimeError):
        return
    reason = gap_reason(str(call.excinfo.value))
    if reason is None:
        return
    report.outcome = "skipped"
    report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {reason}")
    if "exactness" in item.keywords:  # the table's row for it (suites/verdict.py)
        verdict = numerics.Verdict(numerics.INCONCLUSIVE, float("nan"), detail=reason)
        store = next((v for k, v in report.user_properties if k == PROPERTY), None)
        if store is None:
            store = {}
            report.user_properties.append((PROPERTY, store))
        store[f"{BACKEND_GAP}\x1f-\x1f-"] = {**verdict.to_json(), "n": 1}
