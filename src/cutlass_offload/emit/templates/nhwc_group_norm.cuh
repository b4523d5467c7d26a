// cutlass_offload: the NHWC group norm (+ SiLU) kernels (emit/group_norm.py), hand-written CUDA.
// Inlined once into each translation unit that holds such a kernel, after the CUTLASS
// includes the emitter lists; templates only, so an instantiation in two objects of one
// library links once.
#ifndef CO_NHWC_GROUP_NORM_COMMON_
#define CO_NHWC_GROUP_NORM_COMMON_
namespace co_nhwc_group_norm {

constexpr int kThreads = 512;         // threads per block at most
constexpr int kMaxColumns = 512;      // vector columns of one block at most (blockDim.x)
constexpr int kCachedBytes = 64;      // bytes per thread held in registers (stats, fused)
constexpr int kApplyUnroll = 4;       // vectors in flight per thread (apply)
constexpr int kRowBytes = 64;         // contiguous bytes per pixel a fused block should read

// vectors of one column a thread holds in registers (32 16-bit or 16 fp32 elements)
__host__ __device__ constexpr int cached_vectors(int vec, int esize) {
  return kCachedBytes / (vec * esize) < 16 ? kCachedBytes / (vec * esize) : 16;
}

// The launch shape of one call; the same on the host and in the kernels.
struct Plan {
  int64_t hw;           // pixels per image
  int64_t nvc;          // vector columns per pixel (C / vec)
  int64_t vpg;          // vector columns per group
  int64_t groups;
  int64_t gpb;          // groups per block (a chunk of channels)
  int64_t chunks;       // groups / gpb
  int64_t tiles;        // pixel tiles per (n, chunk)
  int64_t tile_pixels;
  int bx, by;           // block: bx = gpb * vpg columns, by pixel lanes
  int fused;            // one launch: a block holds its whole (n, chunk) in registers
};

// (count, mean, sum of squared deviations) of a set of values
struct Moments {
  float n, mean, m2;
};

// Chan, Golub, LeVeque: the moments of the union of two disjoint sets.
__device__ __forceinline__ Moments merge(const Moments& a, const Moments& b) {
  const float n = a.n + b.n;
  if (n == 0.f) return a;
  const float d = b.mean - a.mean;
  const float fb = b.n / n;
  return {n, a.mean + d * fb, a.m2 + b.m2 + d * d * a.n * fb};
}

__device__ __forceinline__ float2 finish(const Moments& m, float eps) {
  // not fmaxf: it would turn the NaN of an inf input (inf - inf) into 0 and give
  // finite outputs; PyTorch gives the whole group NaN
  const float var = m.n > 0.f ? (m.m2 < 0.f ? 0.f : m.m2) / m.n : 0.f;
  return make_float2(m.mean, rsqrtf(var + eps));
}

// Workspace: N * G float2 (mean, rstd), then N * G * tiles * 3 floats of partials
// when tiles > 1; none for a fused launch.
inline int64_t stats_bytes(int64_t n, const Plan& p) { return n * p.groups * int64_t(sizeof(float2)); }

inline int64_t workspace_bytes(int64_t n, const Plan& p) {
  if (p.fused) return 0;
  return stats_bytes(n, p) + (p.tiles > 1 ? n * p.groups * p.tiles * 3 * int64_t(sizeof(float)) : 0);
}

// Fills p for elements of esize bytes read vec at a time; false when the kernels
// cannot run the problem.
inline bool make_plan(const CoGroupNormArgs& a, int vec, int esize, Plan& p) {
  if (a.n < 1 || a.h < 1 || a.w < 1 || a.c < 1 || a.groups < 1 || a.c % a.groups != 0) return false;
  const int64_t cpg = a.c / a.groups;
  if (cpg % vec != 0 || cpg / vec > kMaxColumns) return false;
  p.hw = a.h * a.w;
  p.nvc = a.c / vec;
  p.vpg = cpg / vec;
  p.groups = a.groups;
  if (a.n * a.groups > int64_t(INT32_MAX) / 32) return false;

  // One launch when a block can hold a whole (n, chunk) in registers: the chunk
  // of the fewest groups giving kRowBytes per pixel, or the most that fit.
  const int64_t held = cached_vectors(vec, esize);
  const int64_t lanes = (p.hw + held - 1) / held;
  int64_t fit = 0;
  for (int64_t d = 1; d <= a.groups && d * p.vpg * lanes <= kThreads; ++d) {
    if (a.groups % d != 0) continue;
    fit = d;
    if (d * p.vpg * vec * esize >= kRowBytes) break;
  }
  if (fit > 0) {
    p.fused = 1;
    p.gpb = fit;
    p.chunks = a.groups / fit;
    p.bx = int(fit * p.vpg);
    p.by = int(kThreads / p.bx < p.hw ? kThreads / p.bx : p.hw);   // >= lanes
    p.tiles = 1;
    p.tile_pixels = p.hw;
    return a.n * p.chunks <= int64_t(INT32_MAX);
  }

  // Three launches: the most groups per block with at most kThreads columns
  p.fused = 0;
  p.gpb = 1;
  const int64_t most_groups = kThreads / p.vpg;
  for (int64_t d = a.groups < most_groups ? a.groups : most_groups; d > 1; --d) {
    if (a.groups % d == 0) { p.gpb = d; break; }
  }
  p.chunks = a.groups / p.gpb;
  p.bx = int(p.gpb * p.vpg);
  p.by = p.bx >= kThreads ? 1 : kThreads / p.bx;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1) {
    (void)cudaGetLastError();
    sms = 132;
  }
  // about two blocks per SM, at least one pixel per lane of a tile
  const int64_t per_tile = a.n * p.chunks;
  int64_t tiles = (2 * int64_t(sms) + per_tile - 1) / per_tile;
  const int64_t most = (p.hw + p.by - 1) / p.by;
  tiles = tiles < 1 ? 1 : (tiles > most ? most : tiles);
  p.tile_pixels = (p.hw + tiles - 1) / tiles;
  p.tiles = (p.hw + p.tile_pixels - 1) / p.tile_pixels;
  return a.n * p.chunks * p.tiles <= int64_t(INT32_MAX);
}

template <typename T, int kVec>
struct Io {
  using Vec = cutlass::AlignedArray<T, kVec>;
  using Frag = cutlass::Array<float, kVec>;

  static __device__ __forceinline__ Frag widen(const Vec& v) {
    cutlass::NumericArrayConverter<float, T, kVec> cvt;
    return cvt(v);
  }

  static __device__ __forceinline__ Vec narrow(const Frag& f) {
    cutlass::NumericArrayConverter<T, float, kVec, cutlass::FloatRoundStyle::round_to_nearest> cvt;
    Vec v;
    static_cast<cutlass::Array<T, kVec>&>(v) = cvt(f);
    return v;
  }

  // exact two-pass moments of the first `valid` of the held vectors
  template <int kR>
  static __device__ __forceinline__ Moments moments(const Vec (&v)[kR], int valid) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kR; ++k) {
      if (k < valid) {
        const Frag f = widen(v[k]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) s += f[j];
      }
    }
    const float cnt = float(valid * kVec);
    const float mean = valid > 0 ? s / cnt : 0.f;
    float q = 0.f;
#pragma unroll
    for (int k = 0; k < kR; ++k) {
      if (k < valid) {
        const Frag f = widen(v[k]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float d = f[j] - mean;
          q += d * d;
        }
      }
    }
    return {cnt, mean, q};
  }
};

// y = (x - mean) * (rstd * w) + b [then silu], for the vector column `col`
template <typename T, int kVec, bool kWeight, bool kBias, bool kSilu>
struct Normalize {
  using IO = Io<T, kVec>;
  using Vec = typename IO::Vec;
  using Frag = typename IO::Frag;
  float mean;
  Frag scale, shift;

  __device__ __forceinline__ Normalize(const T* weight, const T* bias, int64_t col, float2 st) : mean(st.x) {
    Frag fw, fb;
    if (kWeight) fw = IO::widen(reinterpret_cast<const Vec*>(weight)[col]);
    if (kBias) fb = IO::widen(reinterpret_cast<const Vec*>(bias)[col]);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      scale[j] = kWeight ? st.y * fw[j] : st.y;
      shift[j] = kBias ? fb[j] : 0.f;
    }
  }

  __device__ __forceinline__ Vec operator()(const Vec& v) const {
    const Frag f = IO::widen(v);
    Frag o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      o[j] = (f[j] - mean) * scale[j] + shift[j];
    }
    if (kSilu) {
      // PyTorch rounds group_norm's output to T before its SiLU: so do we, so that an
      // fp16 overflow gives inf there and silu(-inf) = NaN, as in PyTorch
      o = IO::widen(IO::narrow(o));
#pragma unroll
      for (int j = 0; j < kVec; ++j) o[j] = o[j] / (1.f + __expf(-o[j]));
    }
    return IO::narrow(o);
  }
};

// Merges the moments of the block's threads group by group: slot j = ty * vpg +
// (tx % vpg) of group tx / vpg, a shared-memory tree over the blockDim.y * vpg
// slots of each group. Every thread calls it; afterwards the thread with j == 0
// (true returned) holds its group's moments in acc.
__device__ __forceinline__ bool group_reduce(Moments& acc, Moments* smem, int vpg) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * blockDim.x + tx;
  const int local = tx / vpg;
  const int j = ty * vpg + tx % vpg;
  const int size = blockDim.y * vpg;
  smem[tid] = acc;
  int stride = 1;
  while (stride < size) stride <<= 1;
  for (stride >>= 1; stride > 0; stride >>= 1) {
    __syncthreads();
    if (j < stride && j + stride < size) {
      const int k = j + stride;
      smem[tid] = merge(smem[tid], smem[(k / vpg) * blockDim.x + local * vpg + k % vpg]);
    }
  }
  __syncthreads();
  acc = smem[tid];
  return j == 0;
}

// blockIdx.x -> (n, chunk, tile)
__device__ __forceinline__ void block_coords(const Plan& p, int64_t& n, int64_t& chunk, int64_t& tile) {
  const int64_t b = blockIdx.x;
  tile = b % p.tiles;
  chunk = (b / p.tiles) % p.chunks;
  n = b / (p.tiles * p.chunks);
}

// One launch: the block's (n, chunk) slice held in registers, statistics, normalize.
template <typename T, int kVec, bool kWeight, bool kBias, bool kSilu>
__global__ void __launch_bounds__(512)
group_norm_fused(const T* __restrict__ input, const T* __restrict__ weight, const T* __restrict__ bias,
                 T* __restrict__ output, const Plan p, float eps) {
  using IO = Io<T, kVec>;
  using Vec = typename IO::Vec;
  constexpr int kR = cached_vectors(kVec, int(sizeof(T)));
  __shared__ Moments smem[kMaxColumns];
  __shared__ float2 group_stats[kMaxColumns];

  int64_t n, chunk, tile;
  block_coords(p, n, chunk, tile);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int by = blockDim.y;
  const int64_t col = chunk * p.bx + tx;
  const int64_t offset = n * p.hw * p.nvc + col;
  const int64_t step = int64_t(by) * p.nvc;
  const int64_t left = ty < p.hw ? (p.hw - ty + by - 1) / by : 0;
  const int valid = left < kR ? int(left) : kR;

  Vec v[kR];
  const Vec* src = reinterpret_cast<const Vec*>(input) + offset + int64_t(ty) * p.nvc;
#pragma unroll
  for (int k = 0; k < kR; ++k, src += step) {
    if (k < valid) v[k] = *src;
  }
  Moments acc = IO::template moments<kR>(v, valid);
  const int vpg = int(p.vpg);
  if (group_reduce(acc, smem, vpg)) group_stats[tx / vpg] = finish(acc, eps);
  __syncthreads();

  const Normalize<T, kVec, kWeight, kBias, kSilu> norm(weight, bias, col, group_stats[tx / vpg]);
  Vec* dst = reinterpret_cast<Vec*>(output) + offset + int64_t(ty) * p.nvc;
#pragma unroll
  for (int k = 0; k < kR; ++k, dst += step) {
    if (k < valid) *dst = norm(v[k]);
  }
}

// Three launches, 1: the (count, mean, M2) of each group over one pixel tile (or,
// with a single tile, its (mean, rstd)).
template <typename T, int kVec>
__global__ void __launch_bounds__(512, 2)
group_norm_stats(const T* __restrict__ input, float* __restrict__ partials,
                 float2* __restrict__ stats, const Plan p, float eps) {
  using IO = Io<T, kVec>;
  using Vec = typename IO::Vec;
  constexpr int kR = cached_vectors(kVec, int(sizeof(T)));
  __shared__ Moments smem[kMaxColumns];

  int64_t n, chunk, tile;
  block_coords(p, n, chunk, tile);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int by = blockDim.y;
  const int64_t col = chunk * p.bx + tx;
  const Vec* x = reinterpret_cast<const Vec*>(input) + n * p.hw * p.nvc + col;
  const int64_t p0 = tile * p.tile_pixels;
  const int64_t p1 = p0 + p.tile_pixels < p.hw ? p0 + p.tile_pixels : p.hw;

  // a lane's pixels are by apart: kR of them at a time, held in registers as loaded
  const int64_t step = int64_t(by) * p.nvc;
  Moments acc{0.f, 0.f, 0.f};
  for (int64_t base = p0 + ty; base < p1; base += int64_t(kR) * by) {
    const int64_t left = (p1 - base + by - 1) / by;
    const int valid = left < kR ? int(left) : kR;
    const Vec* src = x + base * p.nvc;
    Vec v[kR];
#pragma unroll
    for (int k = 0; k < kR; ++k, src += step) {
      if (k < valid) v[k] = *src;
    }
    acc = merge(acc, IO::template moments<kR>(v, valid));
  }

  const int vpg = int(p.vpg);
  if (group_reduce(acc, smem, vpg)) {
    const int64_t g = n * p.groups + chunk * p.gpb + tx / vpg;
    if (p.tiles == 1) {
      stats[g] = finish(acc, eps);
    } else {
      float* out = partials + (g * p.tiles + tile) * 3;
      out[0] = acc.n;
      out[1] = acc.mean;
      out[2] = acc.m2;
    }
  }
}

// Three launches, 2 (with several tiles): one warp per (n, group) merges its tiles'
// partials into (mean, rstd). A template (kBlock threads per block) so that two
// objects of one library defining it link once.
template <int kBlock>
__global__ void __launch_bounds__(kBlock)
group_norm_finalize(const float* __restrict__ partials, float2* __restrict__ stats,
                    int64_t count, int64_t tiles, float eps) {
  const int64_t g = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (g >= count) return;  // the whole warp
  const float* q = partials + g * tiles * 3;
  Moments m{0.f, 0.f, 0.f};
  for (int64_t t = lane; t < tiles; t += 32) m = merge(m, Moments{q[3 * t], q[3 * t + 1], q[3 * t + 2]});
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) {
    const Moments o{__shfl_xor_sync(0xffffffffu, m.n, mask), __shfl_xor_sync(0xffffffffu, m.mean, mask),
                    __shfl_xor_sync(0xffffffffu, m.m2, mask)};
    m = merge(m, o);
  }
  if (lane == 0) stats[g] = finish(m, eps);
}

// Three launches, 3: normalize, same blocks and tiles as the statistics.
template <typename T, int kVec, bool kWeight, bool kBias, bool kSilu>
__global__ void __launch_bounds__(512, 2)
group_norm_apply(const T* __restrict__ input, const T* __restrict__ weight, const T* __restrict__ bias,
                 T* __restrict__ output, const float2* __restrict__ stats, const Plan p) {
  using Vec = typename Io<T, kVec>::Vec;

  int64_t n, chunk, tile;
  block_coords(p, n, chunk, tile);
  const int by = blockDim.y;
  const int64_t col = chunk * p.bx + threadIdx.x;
  const Normalize<T, kVec, kWeight, kBias, kSilu> norm(weight, bias, col, stats[n * p.groups + col / p.vpg]);
  const int64_t offset = n * p.hw * p.nvc + col;
  const Vec* x = reinterpret_cast<const Vec*>(input) + offset;
  Vec* y = reinterpret_cast<Vec*>(output) + offset;
  const int64_t p0 = tile * p.tile_pixels;
  const int64_t p1 = p0 + p.tile_pixels < p.hw ? p0 + p.tile_pixels : p.hw;

  const int64_t step = int64_t(by) * p.nvc;
  for (int64_t base = p0 + threadIdx.y; base < p1; base += int64_t(kApplyUnroll) * by) {
    const int64_t left = (p1 - base + by - 1) / by;
    const int valid = left < kApplyUnroll ? int(left) : kApplyUnroll;
    const int64_t first = base * p.nvc;
    Vec v[kApplyUnroll];
#pragma unroll
    for (int k = 0; k < kApplyUnroll; ++k) {
      if (k < valid) v[k] = x[first + k * step];
    }
#pragma unroll
    for (int k = 0; k < kApplyUnroll; ++k) {
      if (k < valid) y[first + k * step] = norm(v[k]);
    }
  }
}

template <typename T, int kVec, bool kWeight, bool kBias, bool kSilu>
int run(const CoGroupNormArgs& a, cudaStream_t stream) {
  if (a.n == 0) return CO_OK;  // empty output: nothing to launch
  Plan p;
  if (!make_plan(a, kVec, int(sizeof(T)), p)) return CO_CANNOT_IMPLEMENT;
  const uintptr_t align = uintptr_t(kVec * sizeof(T));
  auto aligned = [align](const void* q) { return reinterpret_cast<uintptr_t>(q) % align == 0; };
  if (a.input == nullptr || a.output == nullptr || !aligned(a.input) || !aligned(a.output))
    return CO_CANNOT_IMPLEMENT;
  if (kWeight && (a.weight == nullptr || !aligned(a.weight))) return CO_CANNOT_IMPLEMENT;
  if (kBias && (a.bias == nullptr || !aligned(a.bias))) return CO_CANNOT_IMPLEMENT;
  const T* x = static_cast<const T*>(a.input);
  const T* w = static_cast<const T*>(a.weight);
  const T* b = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.output);
  const dim3 grid(unsigned(a.n * p.chunks * p.tiles)), block(unsigned(p.bx), unsigned(p.by));
  if (p.fused) {
    group_norm_fused<T, kVec, kWeight, kBias, kSilu><<<grid, block, 0, stream>>>(x, w, b, y, p, a.eps);
  } else {
    if (a.workspace == nullptr || reinterpret_cast<uintptr_t>(a.workspace) % 16 != 0 ||
        a.workspace_bytes < workspace_bytes(a.n, p))
      return CO_WORKSPACE_TOO_SMALL;
    float2* stats = static_cast<float2*>(a.workspace);
    float* partials = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + stats_bytes(a.n, p));
    group_norm_stats<T, kVec><<<grid, block, 0, stream>>>(x, partials, stats, p, a.eps);
    if (p.tiles > 1) {
      const int64_t count = a.n * p.groups;
      group_norm_finalize<256><<<dim3(unsigned((count * 32 + 255) / 256)), dim3(256), 0, stream>>>(
          partials, stats, count, p.tiles, a.eps);
    }
    group_norm_apply<T, kVec, kWeight, kBias, kSilu><<<grid, block, 0, stream>>>(x, w, b, y, stats, p);
  }
  if (cudaGetLastError() != cudaSuccess) return CO_LAUNCH_FAILED;
  return CO_OK;
}

template <typename T, int kVec>
int64_t workspace_size(const CoGroupNormArgs& a) {
  Plan p;
  if (a.n < 1 || !make_plan(a, kVec, int(sizeof(T)), p)) return 0;
  return workspace_bytes(a.n, p);
}

}  // namespace co_nhwc_group_norm
#endif  // CO_NHWC_GROUP_NORM_COMMON_
