"""Row kernels (treespec.backend.row_kernels) against MLX's one-row calls on
this backend: per dtype, weight layout, shape and row count, how many rows
are bit-identical to the row computed alone, and what MLX's own multi-row
call gives beside it; then the cost of T rows through each, medians of
interleaved repeats. One JSON line per measurement on stdout.

    PYTHONPATH=. python3 results/exact-at-speed/kernel_probe.py [--quick] [--cols 1,2,4,8]

``--cols``: the quantized kernel's output columns per warp to compare
(row_kernels.COLS_CHOICES; default: its per-width default, row_kernels.COLS);
every value is checked for bit identity and timed.
"""

import argparse
import json
import statistics
import sys
import time

import mlx.core as mx

from treespec.backend import row_kernels as rk

SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096), (2048, 5504), (4096, 32000), (2880, 640)]
ROWS = (1, 2, 3, 5, 7, 8, 9, 16)


def quantized(k, n, dtype, bits, group):
    w = mx.random.normal((n, k)).astype(dtype) * 0.05
    return mx.quantize(w, group_size=group, bits=bits)


def qcall(x, wq, s, b, bits, group):
    return mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=group, bits=bits)


def compare(alone, batch, kernel):
    same_k = [bool(mx.array_equal(kernel[i], alone[i]).item()) for i in range(len(alone))]
    same_b = [bool(mx.array_equal(batch[i], alone[i]).item()) for i in range(len(alone))]
    diff = mx.max(mx.abs(kernel.astype(mx.float32) - alone.astype(mx.float32))).item()
    return sum(same_k), sum(same_b), diff


def identity(quick, cols=(None,), row_counts=ROWS):
    dtypes = (mx.bfloat16,) if quick else (mx.bfloat16, mx.float16, mx.float32)
    for dtype in dtypes:
        for bits, group in [(4, 64), (8, 64), (4, 32), (4, 128), (2, 64), (6, 64)][: 2 if quick else 6]:
            for k, n in SHAPES[: 2 if quick else None]:
                if k % group:
                    continue
                wq, s, b = quantized(k, n, dtype, bits, group)
                for rows in row_counts:
                    x = mx.random.normal((rows, k)).astype(dtype)
                    alone = mx.concatenate([qcall(x[i][None, None], wq, s, b, bits, group)[0]
                                            for i in range(rows)])
                    batch = qcall(x[:, None], wq, s, b, bits, group)[:, 0]
                    for c in cols:
                        kern = rk.quantized_rows(x, wq, s, b, bits, group, cols=c)
                        mx.eval(alone, batch, kern)
                        same_k, same_b, diff = compare(alone, batch, kern)
                        print(json.dumps(dict(kind="quantized", dtype=str(dtype), bits=bits,
                                              group=group, k=k, n=n, rows=rows, cols=c,
                                              kernel_identical=same_k, mlx_batch_identical=same_b,
                                              kernel_max_diff=diff)), flush=True)
        for k, n in SHAPES[: 2 if quick else None]:
            w = (mx.random.normal((n, k)) * 0.05).astype(dtype)
            for rows in row_counts:
                x = mx.random.normal((rows, k)).astype(dtype)
                alone = mx.concatenate([(x[i][None, None] @ w.T)[0] for i in range(rows)])
                batch = (x[:, None] @ w.T)[:, 0]
                kern = rk.dense_rows(x, w)
                mx.eval(alone, batch, kern)
                same_k, same_b, diff = compare(alone, batch, kern)
                print(json.dumps(dict(kind="dense", dtype=str(dtype), k=k, n=n, rows=rows,
                                      kernel_identical=same_k, mlx_batch_identical=same_b,
                                      kernel_max_diff=diff)), flush=True)


def timed(fn, calls=40):
    mx.eval(fn())
    t = time.perf_counter()
    outs = [fn() for _ in range(calls)]
    mx.eval(outs)
    return (time.perf_counter() - t) / calls * 1e3


def cost(repeats, cols=(None,), row_counts=(1, 2, 5, 8, 16)):
    for (k, n), bits in [((4096, 4096), 4), ((4096, 11008), 4), ((11008, 4096), 4), ((4096, 11008), 8)]:
        wq, s, b = quantized(k, n, mx.bfloat16, bits, 64)
        for rows in row_counts:
            x = mx.random.normal((rows, k)).astype(mx.bfloat16)
            ways = {"mlx_one_row": lambda: qcall(x[:1][None], wq, s, b, bits, 64),
                    "mlx_batch": lambda: qcall(x[:, None], wq, s, b, bits, 64),
                    "mlx_tokens": lambda: qcall(x[None], wq, s, b, bits, 64),
                    **{"kernel" if c is None else f"kernel_c{c}": lambda c=c: rk.quantized_rows(x, wq, s, b, bits, 64, cols=c)
                       for c in cols}}
            ms = {name: [] for name in ways}
            for _ in range(repeats):
                for name, fn in ways.items():
                    ms[name].append(timed(fn))
            print(json.dumps(dict(kind="cost", bits=bits, k=k, n=n, rows=rows,
                                  ms={m: statistics.median(v) for m, v in ms.items()})), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-cost", action="store_true")
    ap.add_argument("--no-identity", action="store_true")
    ap.add_argument("--cols", default=None,
                    help="comma list of the kernel's columns per warp (default: row_kernels.COLS)")
    ap.add_argument("--rows", default=None, help="comma list of row counts (identity and cost)")
    args = ap.parse_args()
    if not rk.available():
        sys.exit("row kernels need MLX's CUDA backend")
    mx.random.seed(0)
    print(json.dumps(dict(kind="device", device=str(mx.default_device()),
                          info=mx.device_info() if hasattr(mx, "device_info") else None)), flush=True)
    cols = (None,) if args.cols is None else tuple(int(c) for c in args.cols.split(","))
    rows = {} if args.rows is None else {"row_counts": tuple(int(r) for r in args.rows.split(","))}
    if not args.no_identity:
        identity(args.quick, cols, **rows)
    if not args.no_cost:
        cost(args.repeats, cols, **rows)


if __name__ == "__main__":
    main()
