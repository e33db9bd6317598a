"""Is the quantized row kernel bound by how few weight loads a warp has in
flight? A variant of treespec.backend.row_kernels' kernel, measured beside
it on a CUDA backend. One JSON line per measurement on stdout.

    PYTHONPATH=. python3 results/exact-at-speed/pipe_probe.py [--bits 4,8] [--unroll 2,4] [--rows 1,2,5,8] [--cols 1,2]

Why: MLX's one-row ``qmv`` (4-bit, 4096 -> 11008) took 41 us on the H100 for
22 MB of weights, about 550 GB/s of 3.35 TB/s; the row kernels, which repeat
its order, took 93 us for 5 rows (README.md here). Each thread walks its
``K / (32 E)`` tiles one at a time, and in the row kernel every tile's loads
sit behind the guards ``c < cols`` and ``m < rows`` (a chunk's last rows or
columns), so the compiler cannot issue the next tile's loads before this
tile's arithmetic: one 8-byte weight load per thread in flight.

The variant: where a warp's chunk is full (every row and column present,
all but the last chunk), the tile loop runs without guards and unrolled by
U, so the loads of U tiles can be issued together. Every accumulator still
sees the same fused multiply-adds in the same order (tile t before t + 1),
so its rows must stay bit-identical to the kernel's and to MLX's one-row
call; this probe checks that before it times anything. Compiled for sm_90
with nvcc 13 here: registers 128 -> 187 (2 columns, 5 rows), 46 -> 40 (one
row, one column); 8 rows x 2 columns spill ~100 bytes. Whether the extra
loads in flight beat the lower occupancy is what the timing says.

Measured on an H200 at 89d4d72 (README.md here, h200-pipe/): every row
bit-identical; at 4 bits and 5 rows 1-16 % cheaper, at 8 bits 2 rows 2x
cheaper than the package's one-column kernel. On an H100 at 7ba53b2, 8 bits
at 3-5 rows: 1.3-2.2x cheaper, every row bit-identical; the package's kernel
then took the unguarded loop (UNROLL 4), so this probe runs against the
package as it was before that (9e4ceb1 or earlier): it rewrites the older
header and stops, naming the line, on the newer one.
"""

import argparse
import json
import statistics

import mlx.core as mx

from kernel_probe import qcall, quantized, timed
from treespec.backend import row_kernels as rk

LOOP = "  for (int t = 0; t < K / TILE; ++t) tile(lane * E + t * TILE);"


def piped_header(unroll: int) -> str:
    """row_kernels' header with the full-chunk tile loop unguarded and unrolled."""
    h = rk._HEADER
    swaps = [
        ("  auto tile = [&](int idx) {",
         "  auto tile = [&](int idx, auto full) {\n    constexpr bool FULL = decltype(full)::value;"),
        ("      if (c < cols) {", "      if (FULL || c < cols) {"),
        ("      if (m < rows) {\n        auto xv", "      if (FULL || m < rows) {\n        auto xv"),
        (LOOP, "  if (rows == R && cols == C) {\n"
               f"#pragma unroll {unroll}\n"
               "    for (int t = 0; t < K / TILE; ++t) tile(lane * E + t * TILE, cuda::std::true_type{});\n"
               "  } else {\n"
               "    for (int t = 0; t < K / TILE; ++t) tile(lane * E + t * TILE, cuda::std::false_type{});\n"
               "  }"),
        ("if (idx < K) tile(idx);", "if (idx < K) tile(idx, cuda::std::false_type{});"),
    ]
    for old, new in swaps:
        if h.count(old) != 1:
            raise SystemExit(f"row_kernels' header changed: {old!r} found {h.count(old)} times")
        h = h.replace(old, new)
    return h


def variant(unroll: int):
    kernel = mx.fast.cuda_kernel(name=f"treespec_rows_quantized_pipe{unroll}",
                                 input_names=["x", "w", "scales", "biases"], output_names=["out"],
                                 source=rk._QUANTIZED, header=piped_header(unroll))

    def call(x, wq, s, b, bits, group, cols):
        rows, n = x.shape[0], wq.shape[0]
        # A chunk of exactly the call's rows (up to MAX_ROWS), compiled per row count, for
        # one column too (row_kernels takes 8 there): else no chunk of 1-7 rows is full.
        r = max(1, min(rows, rk.MAX_ROWS))
        warps = -(-n // cols)
        return kernel(inputs=[x, wq, s, b],
                      template=[("T_", x.dtype), ("BITS", bits), ("GROUP", group), ("COLS", cols),
                                ("RCHUNK", r)],
                      output_shapes=[(rows, n)], output_dtypes=[x.dtype],
                      grid=(32, 8 * -(-warps // 8), -(-rows // r)), threadgroup=(32, 8, 1))[0]
    return call


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unroll", default="2,4")
    ap.add_argument("--rows", default="1,2,5,8")
    ap.add_argument("--cols", default="1,2")
    ap.add_argument("--bits", default="4,8", help="weight widths to measure")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not rk.available():
        raise SystemExit(f"a CUDA probe; this process computes on {mx.default_device()}")
    unrolls = [int(u) for u in args.unroll.split(",")]
    rows_list = [int(r) for r in args.rows.split(",")]
    cols_list = [int(c) for c in args.cols.split(",")]
    calls = {u: variant(u) for u in unrolls}
    widths = {int(b) for b in args.bits.split(",")}
    shapes = [(4096, 4096), (4096, 11008), (11008, 4096)]
    for bits, (k, n) in [(b, kn) for b in (4, 8) if b in widths for kn in shapes]:
        wq, s, b = quantized(k, n, mx.bfloat16, bits, 64)
        for rows in rows_list:
            x = mx.random.normal((rows, k)).astype(mx.bfloat16)
            alone = mx.concatenate([qcall(x[i][None, None], wq, s, b, bits, 64)[0] for i in range(rows)])
            ways = {"mlx_one_row": lambda: qcall(x[:1][None], wq, s, b, bits, 64)}
            for c in cols_list:
                kern = rk.quantized_rows(x, wq, s, b, bits, 64, cols=c)
                ways[f"kernel_c{c}"] = lambda c=c: rk.quantized_rows(x, wq, s, b, bits, 64, cols=c)
                for u, call in calls.items():
                    piped = call(x, wq, s, b, bits, 64, c)
                    mx.eval(alone, kern, piped)
                    same = [bool(mx.array_equal(piped[i], alone[i]).item()) for i in range(rows)]
                    print(json.dumps(dict(kind="identity", bits=bits, k=k, n=n, rows=rows, cols=c,
                                          unroll=u, piped_identical_to_one_row=sum(same),
                                          piped_equals_kernel=bool(mx.array_equal(piped, kern).item()))),
                          flush=True)
                    ways[f"piped_u{u}_c{c}"] = lambda c=c, call=call: call(x, wq, s, b, bits, 64, c)
            ms = {name: [] for name in ways}
            for _ in range(args.repeats):  # interleaved: every way once per repeat
                for name, fn in ways.items():
                    ms[name].append(timed(fn))
            print(json.dumps(dict(kind="cost", bits=bits, k=k, n=n, rows=rows,
                                  us={m: round(statistics.median(v) * 1e3, 1) for m, v in ms.items()})),
                  flush=True)


if __name__ == "__main__":
    main()
