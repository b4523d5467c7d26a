// cutlass_offload: the row-wise layer / RMS norm kernels (emit/norm.py), hand-written CUDA.
// Inlined once into each translation unit that holds such a kernel, after the CUTLASS
// includes the emitter lists; templates only, so an instantiation in two objects of one
// library links once.
#ifndef CO_ROWWISE_NORM_COMMON_
#define CO_ROWWISE_NORM_COMMON_
namespace co_rowwise_norm {

constexpr int kCachedVectors = 4;

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

// kUnitOffset: the weight is stored zero-centred and scales by (1 + weight), in fp32
// (Gemma's RMSNorm: x_norm * (1.0 + weight.float()); Nemotron's LayerNorm1P: weight + 1)
template <typename T, int kVec, bool kRms, bool kWeight, bool kBias, bool kUnitOffset>
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
      if (kWeight) v *= kUnitOffset ? 1.f + fw[j] : fw[j];
      if (kBias) v += fb[j];
      o[j] = v;
    }
    cutlass::NumericArrayConverter<T, float, kVec, cutlass::FloatRoundStyle::round_to_nearest> cvt;
    Vec v;
    static_cast<cutlass::Array<T, kVec>&>(v) = cvt(o);
    y[i] = v;
  }
};

template <typename T, int kVec, bool kRms, bool kWeight, bool kBias, bool kUnitOffset>
__global__ void __launch_bounds__(1024)
rowwise_norm_kernel(const T* __restrict__ input, const T* __restrict__ weight,
                    const T* __restrict__ bias, T* __restrict__ output,
                    int64_t rows, int64_t cols, float eps) {
  using R = Row<T, kVec, kRms, kWeight, kBias, kUnitOffset>;
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
