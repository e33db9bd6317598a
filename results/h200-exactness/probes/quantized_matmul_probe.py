# Archived one-question probe (issue 41): scripts/quantized_matmul_probe.py as it stood at 7dc635f,
# beside the record(s) it produced; not run or tested since (its imports may have moved).
# Record(s):
#   results/h200-exactness/quantized-matmul-probe.txt (the H200, MLX 0.32.4 CUDA; recorded in d91811a)
# Plain MLX, no treespec: the backend's quantized matmul at the zoo's shapes. suites/numerics'
# soundness checks (treespec.soundness) carry the lasting part.
# The version that produced a record: git show <recording commit>:scripts/quantized_matmul_probe.py

"""Is the backend's quantized matmul deterministic and equal to the matmul of
its own dequantized weights, at the small shapes the zoo models use? Plain
MLX, no treespec: a finding here is the backend's, not the suite's.

    python scripts/quantized_matmul_probe.py      # prints one line per case
"""

import itertools

import mlx.core as mx


def case(rows: int, dim: int, out: int, bits: int, group: int, dtype) -> str:
    mx.random.seed(0)
    w = mx.random.normal((out, dim)).astype(dtype)
    x = mx.random.normal((1, rows, dim)).astype(dtype)
    try:
        q, s, b = mx.quantize(w, group_size=group, bits=bits)
        deq = mx.dequantize(q, s, b, group_size=group, bits=bits)
        runs = [mx.quantized_matmul(x, q, s, b, transpose=True, group_size=group, bits=bits)
                for _ in range(3)]
        mx.eval(runs, deq)
    except Exception as e:  # an unimplemented shape is a finding too
        return f"error: {type(e).__name__}: {str(e)[:90]}"
    ref = x @ deq.T
    same = all(mx.array_equal(runs[0], r).item() for r in runs[1:])
    finite = all(mx.isfinite(r).all().item() for r in runs)
    diff = mx.max(mx.abs(runs[0].astype(mx.float32) - ref.astype(mx.float32))).item()
    return f"repeatable {same}, finite {finite}, max |q - dequantized| {diff:.3g}"


def main():
    print(f"MLX {mx.__version__}, {mx.default_device()}")
    for rows, dim, bits, group, dtype in itertools.product(
            (1, 5, 16), (64, 128), (4, 8), (32, 64), (mx.float32, mx.bfloat16)):
        if dim % group:
            continue
        print(f"rows {rows:2d} dim {dim:3d} bits {bits} group {group:2d} {str(dtype):14s} "
              f"{case(rows, dim, 64, bits, group, dtype)}")


if __name__ == "__main__":
    main()
