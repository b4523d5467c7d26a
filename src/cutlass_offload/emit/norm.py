"""Emit one row-wise normalization kernel (``rowwise_norm`` family): layer_norm or
rms_norm over the last axis, x viewed as packed (rows, cols).

Design: one row per thread block (blockDim.x threads, a multiple of 32, about two
vectors of ``vec`` elements per thread), or, for short rows (blockDim.x == 32),
one warp per row and four rows per block. Loads and stores are ``vec``-element
vectors (``cutlass::AlignedArray``, at most 16 bytes); everything is computed in
fp32 (``cutlass::NumericArrayConverter``) and rounded once on the store. The row
is kept in registers when it fits (up to 4 vectors per thread: 32768 fp16 /
16384 fp32 columns), else it is read again from global memory (L2) per pass.
layer_norm is two-pass (the mean, then the centred sum of squares: no
cancellation, unlike E[x^2] - E[x]^2), biased variance, like PyTorch;
rms_norm needs only the sum of squares. weight and bias are optional
(compile-time), eps is a runtime argument. The launcher never allocates,
launches on the given stream and returns CO_CANNOT_IMPLEMENT for a cols that is
not a multiple of ``vec``, a misaligned or missing pointer, or too many rows.

Why not CUTLASS's own (tools/util/include/cutlass/util):

* ``device_layernorm.h`` adds a hard-coded 1e-5 (``rsqrtf(... + 1e-5)``), so any
  other eps (BERT's 1e-12, 1e-6 in many models) would be silently wrong.
* ``device_rmsnorm.h`` takes eps, but defines a non-template, non-inline
  ``__global__ rmsnorm_twoPassAlgo_e8`` in the header: two objects of one library
  that include it (two shards, a cached shard reused next to a new one, the
  per-region modules) fail to link with "multiple definition of
  cutlass::rmsnorm_twoPassAlgo_e8" (checked with nvcc 13.0). Its host wrapper
  also abort()s the process on a launch error, vectorizes only fp16 with
  cols % 8 == 0 (bf16 / fp32 get scalar loads) and requires a weight.
So both kinds use the kernel below; CUTLASS provides the numeric types, the
aligned vectors and the conversions.
"""
from __future__ import annotations

from string import Template

from ..ir import KernelSource, NormKernel

FAMILY = "rowwise_norm"
CACHED_VECTORS = 4     # vectors per thread kept in registers

_ELEMENT = {"f16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t", "f32": "float"}
_BYTES = {"f16": 2, "bf16": 2, "f32": 4}
INCLUDES = ("cutlass/cutlass.h", "cutlass/array.h", "cutlass/numeric_types.h",
            "cutlass/numeric_conversion.h")

# Shared by every norm kernel of a translation unit (emitted once per TU, guarded).
# Templates only: the same instantiation in two objects of one library links once.
_COMMON = """\
#ifndef CO_ROWWISE_NORM_COMMON_
#define CO_ROWWISE_NORM_COMMON_
namespace co_rowwise_norm {

constexpr int kCachedVectors = ${cached};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
  return v;
}

// Sum of v over the blockDim.x threads of this thread's row, returned to all of
// them. Every thread of the block calls it (it may synchronize). blockDim.x == 32:
// one warp per row (blockDim.y rows per block), shuffles only; otherwise
// blockDim.y == 1 and the warps meet in shared memory.
__device__ __forceinline__ float row_sum(float v, float* smem) {
  v = warp_sum(v);
  if (blockDim.x == 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x >> 5) ? smem[lane] : 0.f;
  v = warp_sum(v);
  __syncthreads();  // smem is reused by the next reduction
  return v;
}

template <typename T, int kVec, bool kRms, bool kWeight, bool kBias>
struct Row {
  using Vec = cutlass::AlignedArray<T, kVec>;
  using Frag = cutlass::Array<float, kVec>;

  // one aligned vector load (an AlignedArray copy: a single 4 / 8 / 16-byte access)
  static __device__ __forceinline__ Frag load(const Vec* p, int64_t i) {
    const Vec v = p[i];
    cutlass::NumericArrayConverter<float, T, kVec> cvt;
    return cvt(v);
  }

  // pass 1: sum (layer_norm) or sum of squares (rms_norm) of one vector
  static __device__ __forceinline__ float first(const Frag& f) {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) s += kRms ? f[j] * f[j] : f[j];
    return s;
  }

  // pass 2 (layer_norm): centred sum of squares of one vector
  static __device__ __forceinline__ float centred(const Frag& f, float mean) {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float d = f[j] - mean;
      s += d * d;
    }
    return s;
  }

  static __device__ __forceinline__ void store(Vec* y, const Vec* w, const Vec* b, int64_t i,
                                               const Frag& f, float mean, float rstd) {
    Frag o, fw, fb;
    if (kWeight) fw = load(w, i);
    if (kBias) fb = load(b, i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float v = (f[j] - mean) * rstd;
      if (kWeight) v *= fw[j];
      if (kBias) v += fb[j];
      o[j] = v;
    }
    cutlass::NumericArrayConverter<T, float, kVec, cutlass::FloatRoundStyle::round_to_nearest> cvt;
    Vec v;
    static_cast<cutlass::Array<T, kVec>&>(v) = cvt(o);
    y[i] = v;
  }
};

template <typename T, int kVec, bool kRms, bool kWeight, bool kBias>
__global__ void __launch_bounds__(1024)
rowwise_norm_kernel(const T* __restrict__ input, const T* __restrict__ weight,
                    const T* __restrict__ bias, T* __restrict__ output,
                    int64_t rows, int64_t cols, float eps) {
  using R = Row<T, kVec, kRms, kWeight, kBias>;
  using Vec = typename R::Vec;
  using Frag = typename R::Frag;
  __shared__ float smem[32];

  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool active = row < rows;  // inactive threads still join the reductions
  const int64_t nvec = cols / kVec;
  const Vec* x = reinterpret_cast<const Vec*>(input + (active ? row : 0) * cols);
  Vec* y = reinterpret_cast<Vec*>(output + (active ? row : 0) * cols);
  const Vec* w = reinterpret_cast<const Vec*>(weight);
  const Vec* b = reinterpret_cast<const Vec*>(bias);
  const bool cached = nvec <= int64_t(blockDim.x) * kCachedVectors;  // same in the block
  const float inv_cols = 1.f / float(cols);

  Frag frag[kCachedVectors];
  float s = 0.f;
  if (cached) {
#pragma unroll
    for (int it = 0; it < kCachedVectors; ++it) {
      const int64_t i = threadIdx.x + int64_t(it) * blockDim.x;
      if (active && i < nvec) {
        frag[it] = R::load(x, i);
        s += R::first(frag[it]);
      }
    }
  } else if (active) {
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) s += R::first(R::load(x, i));
  }
  s = row_sum(s, smem);

  float mean = 0.f, rstd;
  if (kRms) {
    rstd = rsqrtf(s * inv_cols + eps);
  } else {
    mean = s * inv_cols;
    float q = 0.f;
    if (cached) {
#pragma unroll
      for (int it = 0; it < kCachedVectors; ++it) {
        const int64_t i = threadIdx.x + int64_t(it) * blockDim.x;
        if (active && i < nvec) q += R::centred(frag[it], mean);
      }
    } else if (active) {
      for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) q += R::centred(R::load(x, i), mean);
    }
    q = row_sum(q, smem);
    rstd = rsqrtf(q * inv_cols + eps);
  }
  if (!active) return;  // after the last reduction

  if (cached) {
#pragma unroll
    for (int it = 0; it < kCachedVectors; ++it) {
      const int64_t i = threadIdx.x + int64_t(it) * blockDim.x;
      if (i < nvec) R::store(y, w, b, i, frag[it], mean, rstd);
    }
  } else {
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) R::store(y, w, b, i, R::load(x, i), mean, rstd);
  }
}

}  // namespace co_rowwise_norm
#endif  // CO_ROWWISE_NORM_COMMON_
"""

_KERNEL = """\
namespace ${name} {

using Element = ${element};
constexpr int kVec = ${vec};
constexpr bool kRms = ${rms};
constexpr bool kWeight = ${weight};
constexpr bool kBias = ${bias};

static bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % uintptr_t(kVec * sizeof(Element)) == 0;
}

int64_t workspace_size(const CoNormArgs&) { return 0; }

int run(const CoNormArgs& args, cudaStream_t stream) {
  if (args.rows < 0 || args.cols <= 0 || args.cols % kVec != 0) return CO_CANNOT_IMPLEMENT;
  if (args.rows == 0) return CO_OK;  // empty output: nothing to launch
  if (args.input == nullptr || args.output == nullptr) return CO_CANNOT_IMPLEMENT;
  if (!aligned(args.input) || !aligned(args.output)) return CO_CANNOT_IMPLEMENT;
  if (kWeight && (args.weight == nullptr || !aligned(args.weight))) return CO_CANNOT_IMPLEMENT;
  if (kBias && (args.bias == nullptr || !aligned(args.bias))) return CO_CANNOT_IMPLEMENT;
  const int64_t nvec = args.cols / kVec;
  // about two vectors per thread, a whole number of warps, at most 1024 threads
  int64_t threads = ((nvec + 1) / 2 + 31) / 32 * 32;
  threads = threads < 32 ? 32 : (threads > 1024 ? 1024 : threads);
  const int64_t rows_per_block = threads == 32 ? 4 : 1;  // short rows: a warp per row
  const int64_t blocks = (args.rows + rows_per_block - 1) / rows_per_block;
  if (blocks > int64_t(INT32_MAX)) return CO_CANNOT_IMPLEMENT;
  co_rowwise_norm::rowwise_norm_kernel<Element, kVec, kRms, kWeight, kBias>
      <<<dim3(unsigned(blocks)), dim3(unsigned(threads), unsigned(rows_per_block)), 0, stream>>>(
          static_cast<const Element*>(args.input), static_cast<const Element*>(args.weight),
          static_cast<const Element*>(args.bias), static_cast<Element*>(args.output),
          args.rows, args.cols, args.eps);
  if (cudaGetLastError() != cudaSuccess) return CO_LAUNCH_FAILED;
  return CO_OK;
}

}  // namespace ${name}
"""


def check(kernel: NormKernel) -> None:
    """Raise ValueError unless this family can build ``kernel``."""
    if kernel.config.family != FAMILY:
        raise ValueError(f"{kernel.name}: not a {FAMILY} kernel")
    if kernel.vec * _BYTES[kernel.dtype] > 16:
        raise ValueError(f"{kernel.name}: vectors are at most 16 bytes")


def emit(kernel: NormKernel) -> KernelSource:
    """The KernelSource of one norm kernel: ``namespace <kernel.name> { int64_t
    workspace_size(const CoNormArgs&); int run(const CoNormArgs&, cudaStream_t); }``
    (run returns a CoStatus), preceded by the shared kernel template (guarded, so
    several norm kernels share one copy per translation unit)."""
    check(kernel)
    common = Template(_COMMON).substitute(cached=CACHED_VECTORS)
    body = Template(_KERNEL).substitute(
        name=kernel.name, element=_ELEMENT[kernel.dtype], vec=kernel.vec,
        rms="true" if kernel.kind == "rms_norm" else "false",
        weight="true" if kernel.weight else "false", bias="true" if kernel.bias else "false")
    return KernelSource(name=kernel.name, includes=INCLUDES, code=common + "\n" + body,
                        args_type="CoNormArgs")
