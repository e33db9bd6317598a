"""Linear layers computed for several rows at once, each row in the order of
MLX's own one-row kernel, on MLX's CUDA backend.

Why: a one-token step multiplies one row through MLX's matrix-vector
kernels (``qmv`` for quantized weights, ``gemv`` for dense ones). A verify of
T nodes hands the same layer T rows, and MLX then picks another kernel
(batched ``qmv`` that reads the weights once per row up to 7 rows, then a
tiled ``qmm``; cuBLAS for dense weights from 2 rows), whose rows either cost
T times the weight traffic or differ in their last bits from the one-row
result (results/exact-at-speed). The kernels here read each weight tile once
for up to 8 rows and give every row the exact sequence of operations the
one-row kernel applies to it: the same per-thread tiling of the reduction
axis, the same dequantization and fused multiply-adds in the same types, the
same in-thread sum and the same warp reduction. Nothing here is declared
exact: the census (:func:`treespec.backend.census`) and the gate compare
their rows with the one-row call on the running backend, and a different
MLX (another tiling) shows up there as a differing row.

The arithmetic each row repeats, read from MLX 0.32's CUDA sources
(``quantized/qmm/qmv.cu``, ``gemms/gemv.cu``), one warp per output column:

- quantized (affine): thread ``t`` owns elements ``[t*E, t*E+E)`` of every
  ``32*E``-wide tile of the reduction axis (E = 16 for 4-bit-or-narrower
  weights with 16-bit activations, else 8); it dequantizes ``q*scale+bias``
  in the activation type and accumulates ``fma(x, w, acc)`` per element, in
  the activation type below 8 bits and in float32 from 8 bits; then the E
  accumulators are summed in float32 in order and the warp reduced;
- dense: thread ``t`` owns ``n`` consecutive elements of every ``32*n``-wide
  tile (n = 4, 2 or 1 as the reduction length divides 128, 64) and
  accumulates ``acc += float(w) * float(x)`` in float32; then the warp
  reduction.

Where a warp's chunk is full (all its rows and columns present: every chunk
but a call's last), the tile loop runs without the per-row and per-column
guards and unrolled by ``UNROLL``, so that the weight loads of several tiles
are in flight together; every accumulator still sees the same operations in
the same order (tile t before t + 1). Measured (results/exact-at-speed,
pipe_probe.py): on an H200 4-bit layers 1-16 % cheaper at 5 rows, on an H100
8-bit layers 1.3-2.2x cheaper at 3-5 rows, every row bit-identical.

A layer this module does not cover (a dense linear with a bias, which MLX
runs through ``addmm``; non-affine quantization; a group size MLX's ``qmv``
does not take) is reported by :func:`coverage` with the reason and runs as
MLX runs it.
"""

from typing import Optional

import mlx.core as mx
import mlx.nn as nn

__all__ = ["MAX_ROWS", "available", "coverage", "dense_rows", "linear_rows", "quantized_rows"]

# Rows one warp carries through a weight tile; more rows run in chunks of this many.
MAX_ROWS = 8
# Output columns one warp carries in the quantized kernel (compiled per value).
COLS_CHOICES = (1, 2, 4, 8)
# The default per weight width, measured on an H100 (results/exact-at-speed,
# kernel_probe.py --cols 1,2,4 at 2, 5 and 8 rows, bfloat16): 2 columns make
# 4-bit layers 1.2-1.6x cheaper than 1 at every row count, every row
# bit-identical; at 8 bits 2 columns help up to 5 rows and cost more at 8, so
# 1 stays; other widths unmeasured, 1.
COLS = {4: 2}
# Tiles a full chunk's loop issues together (1: one at a time), per weight
# width: 4 is what pipe_probe.py measured (4-bit on an H200, 8-bit on an H100)
# and what test_row_kernels ran on CUDA (4 and 8 bits). 2 bits takes it too, not
# measured nor run there (the order per accumulator is U's to keep, whatever U);
# 3, 5 and 6 bits keep the one-tile loop.
UNROLL = {4: 4, 8: 4, 2: 4}

_HEADER = r"""
// utils.cuh (MLX's default kernel header) defines the FP_* classification
// macros; CUTLASS's NVRTC path declares them as an enum of its own.
#undef FP_NAN
#undef FP_INFINITE
#undef FP_ZERO
#undef FP_SUBNORMAL
#undef FP_NORMAL
#include <cooperative_groups/reduce.h>
#include <cutlass/array.h>
#include <cutlass/functional.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>
#include "mlx/backend/cuda/device/cute_dequant.cuh"

namespace treespec_rows {

namespace cg = cooperative_groups;

// MLX hands a kernel CUDA's own 16-bit types; the one-row kernel computes in CUTLASS's.
template <typename T> struct Cut { using type = T; };
template <> struct Cut<__nv_bfloat16> { using type = cutlass::bfloat16_t; };
template <> struct Cut<__half> { using type = cutlass::half_t; };

template <int BITS> struct Packed { using type = cutlass::integer_subbyte<BITS, false>; };
template <> struct Packed<8> { using type = uint8_t; };

// Where a warp works: output column ``col`` (8 warps per block on y), rows
// [r0, r0 + rows) of x (chunk blockIdx.z of R rows).
struct Slot { int col, r0, rows; };

template <int R>
__device__ Slot slot(int ROWS, int N) {
  int r0 = blockIdx.z * R;
  return Slot{int(blockIdx.y * 8 + threadIdx.y), r0, min(R, ROWS - r0)};
}

// Dense: thread t owns NPT consecutive elements of every 32*NPT-wide tile,
// acc += float(w) * float(x) per element, then the warp reduction (MLX's gemv).
template <typename T, int NPT, int R>
__device__ void dense(const T* x, const T* w, T* out, int ROWS, int N, int K) {
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  Slot at = slot<R>(ROWS, N);
  if (at.col >= N) return;
  const T* wr = w + (long)at.col * K;
  const T* xs = x + (long)at.r0 * K;
  float acc[R];
#pragma unroll
  for (int m = 0; m < R; ++m) acc[m] = 0.0f;
  for (int c = NPT * warp.thread_rank(); c < K; c += 32 * NPT) {
    T wv[NPT];
#pragma unroll
    for (int j = 0; j < NPT; ++j) wv[j] = wr[c + j];
#pragma unroll
    for (int m = 0; m < R; ++m) {
      if (m < at.rows) {
#pragma unroll
        for (int j = 0; j < NPT; ++j) {
          acc[m] += static_cast<float>(wv[j]) * static_cast<float>(xs[(long)m * K + c + j]);
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < R; ++m) {
    if (m < at.rows) {
      float sum = cg::reduce(warp, acc[m], cg::plus<float>{});
      if (warp.thread_rank() == 0) out[(long)(at.r0 + m) * N + at.col] = static_cast<T>(sum);
    }
  }
}

// One warp per C consecutive output columns from ``col``; up to R rows of x
// from row r0. Each (row, column) pair keeps its own E accumulators and sees
// the one-row kernel's sequence of operations; what C buys is that a row's
// slice of x is loaded once per tile for C columns instead of once per column.
template <typename T, int BITS, int GROUP, int R, int C, int U>
__device__ void quantized(const T* x, const uint8_t* w, const T* scales, const T* biases, T* out,
                          int ROWS, int N, int K) {
  using Q = typename Packed<BITS>::type;
  constexpr int E = (sizeof(T) <= 2 && BITS <= 4) ? 16 : 8;  // elements per thread per tile
  constexpr int TILE = 32 * E;
  constexpr bool WIDE = BITS >= 8;  // float32 accumulators from 8 bits
  using Acc = cuda::std::conditional_t<WIDE, float, T>;
  using W = cuda::std::conditional_t<WIDE, float, T>;  // a dequantized weight as the fma takes it

  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int col0 = int(blockIdx.y * 8 + threadIdx.y) * C;
  if (col0 >= N) return;
  const int r0 = blockIdx.z * R, rows = min(R, ROWS - r0), cols = min(C, N - col0);
  const int lane = warp.thread_rank();
  const T* xs = x + (long)r0 * K;

  cutlass::Array<Acc, E> acc[R][C];
#pragma unroll
  for (int m = 0; m < R; ++m)
#pragma unroll
    for (int c = 0; c < C; ++c) acc[m][c].fill(Acc(0));

  auto tile = [&](int idx, auto full) {
    constexpr bool FULL = decltype(full)::value;
    cutlass::Array<W, E> wd[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (FULL || c < cols) {
        const long col = col0 + c;
        T scale = scales[col * (K / GROUP) + idx / GROUP];
        T bias = biases[col * (K / GROUP) + idx / GROUP];
        auto wq = *reinterpret_cast<const cutlass::Array<Q, E>*>(w + col * (K * BITS / 8) + idx * BITS / 8);
        cutlass::NumericArrayConverter<T, Q, E> to_t;
        cutlass::Array<T, E> wt = to_t(wq);
        if constexpr (cuda::std::is_same_v<T, float>) {
#pragma unroll
          for (int i = 0; i < E; ++i) wt[i] = wt[i] * scale + bias;
        } else {
          wt = wt * scale + bias;
        }
        if constexpr (WIDE && !cuda::std::is_same_v<T, float>) {
          cutlass::NumericArrayConverter<float, T, E> to_f;
          wd[c] = to_f(wt);
        } else {
          wd[c] = wt;
        }
      }
    }
#pragma unroll
    for (int m = 0; m < R; ++m) {
      if (FULL || m < rows) {
        auto xv = *reinterpret_cast<const cutlass::Array<T, E>*>(xs + (long)m * K + idx);
        if constexpr (WIDE && !cuda::std::is_same_v<T, float>) {
          cutlass::NumericArrayConverter<float, T, E> to_f;
          cutlass::Array<float, E> xf = to_f(xv);
#pragma unroll
          for (int c = 0; c < C; ++c)
            if (FULL || c < cols) acc[m][c] = cutlass::fma(xf, wd[c], acc[m][c]);
        } else {
#pragma unroll
          for (int c = 0; c < C; ++c)
            if (FULL || c < cols) acc[m][c] = cutlass::fma(xv, wd[c], acc[m][c]);
        }
      }
    }
  };

  if (U > 1 && rows == R && cols == C) {
#pragma unroll U
    for (int t = 0; t < K / TILE; ++t) tile(lane * E + t * TILE, cuda::std::true_type{});
  } else {
    for (int t = 0; t < K / TILE; ++t) tile(lane * E + t * TILE, cuda::std::false_type{});
  }
  if (K % TILE != 0) {  // the one-row kernel's residue tile, same slice per thread
    int idx = lane * E + K - K % TILE;
    if (idx < K) tile(idx, cuda::std::false_type{});
  }

#pragma unroll
  for (int m = 0; m < R; ++m) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (m < rows && c < cols) {
        float sum = 0;
#pragma unroll
        for (int i = 0; i < E; ++i) sum += static_cast<float>(acc[m][c][i]);
        sum = cg::reduce(warp, sum, cg::plus<float>{});
        if (lane == 0) out[(long)(r0 + m) * N + col0 + c] = static_cast<T>(sum);
      }
    }
  }
}

}  // namespace treespec_rows
"""

# MLX builds the kernel's signature from the inputs (with ``x_shape`` and
# ``w_shape`` where the source names them) and turns the template arguments into
# constants (T_ the activation dtype, BITS, GROUP): one compiled kernel per
# dtype and weight layout, any shape.
_QUANTIZED = r"""
  using T = typename treespec_rows::Cut<T_>::type;
  treespec_rows::quantized<T, BITS, GROUP, RCHUNK, COLS, UNROLL>(
      reinterpret_cast<const T*>(x), reinterpret_cast<const uint8_t*>(w),
      reinterpret_cast<const T*>(scales), reinterpret_cast<const T*>(biases),
      reinterpret_cast<T*>(out), x_shape[0], w_shape[0], x_shape[1]);
"""

# Dense: template T_ (the activation dtype) and NPT (elements per thread per tile).
_DENSE = r"""
  treespec_rows::dense<T_, NPT, RCHUNK>(x, w, out, x_shape[0], w_shape[0], x_shape[1]);
"""

_KERNELS = {}
GROUPS = (32, 64, 128)
BITS = (2, 3, 4, 5, 6, 8)
DTYPES = (mx.float32, mx.float16, mx.bfloat16)


def available() -> bool:
    """Whether this process computes on MLX's CUDA backend (the only one
    these kernels are written for)."""
    return bool(getattr(mx, "cuda", None) and mx.cuda.is_available()
                and mx.default_device() == mx.gpu)


def _kernel(kind: str):
    if kind not in _KERNELS:
        source = _QUANTIZED if kind == "quantized" else _DENSE
        inputs = ["x", "w", "scales", "biases"] if kind == "quantized" else ["x", "w"]
        _KERNELS[kind] = mx.fast.cuda_kernel(name=f"treespec_rows_{kind}", input_names=inputs,
                                             output_names=["out"], source=source,
                                             header=_HEADER)
    return _KERNELS[kind]


def _launch(kind: str, inputs, rows: int, n: int, dtype, template, cols: int = 1):
    # A chunk of R = min(rows, MAX_ROWS) rows per warp, R compiled in: a call
    # never allocates accumulators for rows it does not have (8 rows x 8
    # columns spill: ptxas, sm_90), and its full chunks take the unguarded loop.
    r = max(1, min(rows, MAX_ROWS))
    chunks = -(-rows // r)
    warps = -(-n // cols)  # one warp per ``cols`` output columns, 8 warps a block
    return _kernel(kind)(inputs=inputs, template=[*template, ("RCHUNK", r)],
                         output_shapes=[(rows, n)],
                         output_dtypes=[dtype], grid=(32, 8 * -(-warps // 8), chunks),
                         threadgroup=(32, 8, 1))[0]


def quantized_rows(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array,
                   bits: int, group_size: int, cols: Optional[int] = None) -> mx.array:
    """``x`` (rows, K) times the affine-quantized ``w`` (N, K*bits/32, as
    ``mx.quantize`` packs it) transposed: (rows, N), each row as MLX's one-row
    ``qmv`` computes it (module docstring). ``cols``: output columns one warp
    carries (each weight tile and each row's slice of x read once for them),
    ``COLS.get(bits, 1)`` by default; it changes the cost, never a row's operations."""
    cols = COLS.get(bits, 1) if cols is None else cols
    if cols not in COLS_CHOICES:
        raise ValueError(f"cols: one of {COLS_CHOICES}, not {cols}")
    rows, k = x.shape
    n = w.shape[0]
    return _launch("quantized", [x, w, scales, biases], rows, n, x.dtype,
                   [("T_", x.dtype), ("BITS", bits), ("GROUP", group_size), ("COLS", cols),
                    ("UNROLL", UNROLL.get(bits, 1))], cols)


def dense_rows(x: mx.array, w: mx.array) -> mx.array:
    """``x`` (rows, K) times the dense ``w`` (N, K) transposed: (rows, N),
    each row as MLX's one-row ``gemv`` computes it."""
    rows, k = x.shape
    n = w.shape[0]
    npt = 4 if k % 128 == 0 else 2 if k % 64 == 0 else 1
    return _launch("dense", [x, w], rows, n, x.dtype,
                   [("T_", x.dtype), ("NPT", npt)])


def coverage(layer: nn.Module) -> Optional[str]:
    """None where :func:`linear_rows` computes ``layer`` (a linear, or an
    embedding's ``as_linear``, a tied output head), else why not."""
    if isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        if getattr(layer, "mode", "affine") != "affine" or layer.get("biases") is None:
            return f"{getattr(layer, 'mode', '?')} quantization (the kernel covers affine only)"
        if layer.bits not in BITS or layer.group_size not in GROUPS:
            return f"{layer.bits}-bit weights in groups of {layer.group_size}: MLX's qmv takes " \
                   f"bits {BITS} and groups {GROUPS}"
        if layer.weight.shape[-1] * 32 // layer.bits % 8:
            return "a reduction length that is not a multiple of 8"
        return None
    if isinstance(layer, (nn.Linear, nn.Embedding)):
        if "bias" in layer:
            return "a dense linear with a bias (MLX runs it through addmm, not its gemv)"
        return None
    return f"{type(layer).__name__} is not a linear layer"


def linear_rows(layer: nn.Module, x: mx.array) -> mx.array:
    """``layer(x)`` for a linear :func:`coverage` accepts (``layer.as_linear(x)``
    for an embedding), every row of ``x`` (any leading shape) computed by this
    module's kernels."""
    lead, k = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, k)
    if flat.dtype not in DTYPES:
        raise ValueError(f"row kernels take {DTYPES}, not {flat.dtype}")
    if isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        y = quantized_rows(flat, layer.weight, layer.scales, layer.biases, layer.bits,
                           layer.group_size)
        if "bias" in layer:
            y = y + layer.bias  # the one-row path adds it after qmv, elementwise
    else:
        y = dense_rows(flat, layer.weight)
    return y.reshape(*lead, y.shape[-1])
