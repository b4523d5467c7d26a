"""Emit one NHWC group_norm kernel (``nhwc_group_norm`` family), optionally with a
fused SiLU: x is (N, H*W, C) packed with the channel innermost (a channels_last
PyTorch tensor), channels [g * C/G, (g + 1) * C/G) form group g.

Design: three launches on the given stream, no allocation, no host sync.

* stats: grid over (n, channel chunk, pixel tile). A block is ``bx`` vector
  columns (whole groups of the chunk, all C when C / vec <= 512) by ``by``
  pixel lanes (about 512 threads); with every channel of a pixel in one block a
  tile is one contiguous range of memory. A thread owns one column (so one
  group), loads ``32 / vec`` vectors of its column (``vec`` elements, at most 16
  bytes, ``cutlass::AlignedArray``) at a time into registers, takes their exact
  two-pass (mean, centred sum of squares) in fp32 and folds it into its running
  (count, mean, M2) with Chan et al.'s pairwise update; the threads of each
  group then merge in a shared-memory tree, and one thread per group writes the
  tile's (count, mean, M2) to the workspace. No E[x^2] - E[x]^2 cancellation
  anywhere: sound for SD's 4096 * 40 elements per group and for tiny groups.
* finalize: one warp per (n, group) merges its tiles' partials (Chan again) into
  (mean, rstd), rstd = rsqrt(M2 / count + eps) (biased variance, as PyTorch).
  Skipped when a single tile covers the image (stats then writes mean, rstd).
* apply: same block shape and tiles; a thread reads its group's (mean, rstd) and
  its column's weight / bias once, then streams its pixels:
  y = (x - mean) * (rstd * w) + b, then silu(y) = y / (1 + exp(-y)), rounded
  once to the output type, 16-byte stores when vec allows.

The tile count is chosen per call for about two blocks per SM (N = 2, G = 32 at
64x64 gives 2 x 128 blocks, not the 64 of one block per (n, group)). The
workspace holds N * G (mean, rstd) pairs and, with several tiles, N * G * tiles
(count, mean, M2) partials; ``workspace_size`` says how much, nothing needs
initializing. ``run`` returns CO_CANNOT_IMPLEMENT for C % groups != 0, a
C / groups not a multiple of ``vec``, more than 1024 vector columns in one group,
a misaligned or missing pointer; CO_WORKSPACE_TOO_SMALL for a short workspace.

Why not CUTLASS's tools/util/include/cutlass/util/device_groupnorm.h (NHWC too;
its kernels are templates, so it would link, unlike device_rmsnorm.h): one block
per (n, group) (64 blocks for SD's N = 2), 2-element vectors at most, 32-bit
indexing, gamma and beta required, bf16 handled through ``half2`` loads and a
float -> half -> bf16 conversion (double rounding, fp16 range), a printf instead
of a status for C % groups != 0, and no activation to fuse.
"""
from __future__ import annotations

from string import Template

from ..ir import GroupNormKernel, KernelSource

FAMILY = "nhwc_group_norm"

_ELEMENT = {"f16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t", "f32": "float"}
_BYTES = {"f16": 2, "bf16": 2, "f32": 4}
INCLUDES = ("cutlass/cutlass.h", "cutlass/array.h", "cutlass/numeric_types.h",
            "cutlass/numeric_conversion.h")

# Shared by every group_norm kernel of a translation unit (emitted once per TU,
# guarded). Kernels are templates and host helpers inline: the same definitions in
# two objects of one library link once.
_COMMON = """\
#ifndef CO_NHWC_GROUP_NORM_COMMON_
#define CO_NHWC_GROUP_NORM_COMMON_
namespace co_nhwc_group_norm {

constexpr int kThreads = 512;         // threads per block aimed at
constexpr int kMaxColumns = 512;      // vector columns of one block at most (blockDim.x)
constexpr int kCachedElements = 32;   // elements per thread held in registers (stats)
constexpr int kApplyUnroll = 4;       // vectors in flight per thread (apply)

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
  const float var = m.n > 0.f ? fmaxf(m.m2, 0.f) / m.n : 0.f;
  return make_float2(m.mean, rsqrtf(var + eps));
}

// Workspace: N * G float2 (mean, rstd), then N * G * tiles * 3 floats of partials
// when tiles > 1.
inline int64_t stats_bytes(int64_t n, const Plan& p) { return n * p.groups * int64_t(sizeof(float2)); }

inline int64_t workspace_bytes(int64_t n, const Plan& p) {
  return stats_bytes(n, p) + (p.tiles > 1 ? n * p.groups * p.tiles * 3 * int64_t(sizeof(float)) : 0);
}

// Fills p; false when the kernel cannot run the problem.
inline bool make_plan(const CoGroupNormArgs& a, int vec, Plan& p) {
  if (a.n < 1 || a.h < 1 || a.w < 1 || a.c < 1 || a.groups < 1 || a.c % a.groups != 0) return false;
  const int64_t cpg = a.c / a.groups;
  if (cpg % vec != 0 || cpg / vec > kMaxColumns) return false;
  p.hw = a.h * a.w;
  p.nvc = a.c / vec;
  p.vpg = cpg / vec;
  p.groups = a.groups;
  // the most groups per block with at most kThreads columns (one group when wider)
  p.gpb = 1;
  const int64_t fit = kThreads / p.vpg;
  for (int64_t d = a.groups < fit ? a.groups : fit; d > 1; --d) {
    if (a.groups % d == 0 && d * p.vpg <= kThreads) { p.gpb = d; break; }
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
  return a.n * p.chunks * p.tiles <= int64_t(INT32_MAX) && a.n * p.groups <= int64_t(INT32_MAX) / 32;
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
};

// blockIdx.x -> (n, chunk, tile)
__device__ __forceinline__ void block_coords(const Plan& p, int64_t& n, int64_t& chunk, int64_t& tile) {
  const int64_t b = blockIdx.x;
  tile = b % p.tiles;
  chunk = (b / p.tiles) % p.chunks;
  n = b / (p.tiles * p.chunks);
}

template <typename T, int kVec>
__global__ void __launch_bounds__(512, 2)
group_norm_stats(const T* __restrict__ input, float* __restrict__ partials,
                 float2* __restrict__ stats, const Plan p, float eps) {
  using IO = Io<T, kVec>;
  using Vec = typename IO::Vec;
  using Frag = typename IO::Frag;
  constexpr int kR = kCachedElements / kVec < 16 ? kCachedElements / kVec : 16;  // vectors held
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
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kR; ++k) {
      if (k < valid) {
        const Frag f = IO::widen(v[k]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) s += f[j];
      }
    }
    const float cnt = float(valid * kVec);
    const float mean = s / cnt;
    float q = 0.f;
#pragma unroll
    for (int k = 0; k < kR; ++k) {
      if (k < valid) {
        const Frag f = IO::widen(v[k]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float d = f[j] - mean;
          q += d * d;
        }
      }
    }
    acc = merge(acc, Moments{cnt, mean, q});
  }

  // merge the block's threads group by group: slot j = ty * vpg + (tx % vpg) of
  // group tx / vpg, a tree over the by * vpg slots of each group
  const int vpg = int(p.vpg);
  const int tid = ty * blockDim.x + tx;
  const int local = tx / vpg;
  const int j = ty * vpg + tx % vpg;
  const int size = by * vpg;
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
  if (j == 0) {
    const Moments m = smem[tid];
    const int64_t g = n * p.groups + chunk * p.gpb + local;
    if (p.tiles == 1) {
      stats[g] = finish(m, eps);
    } else {
      float* out = partials + (g * p.tiles + tile) * 3;
      out[0] = m.n;
      out[1] = m.mean;
      out[2] = m.m2;
    }
  }
}

// one warp per (n, group): merge its tiles' partials into (mean, rstd). A template
// (kBlock threads per block) so that two objects of one library defining it link once.
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

template <typename T, int kVec, bool kWeight, bool kBias, bool kSilu>
__global__ void __launch_bounds__(512, 2)
group_norm_apply(const T* __restrict__ input, const T* __restrict__ weight, const T* __restrict__ bias,
                 T* __restrict__ output, const float2* __restrict__ stats, const Plan p) {
  using IO = Io<T, kVec>;
  using Vec = typename IO::Vec;
  using Frag = typename IO::Frag;

  int64_t n, chunk, tile;
  block_coords(p, n, chunk, tile);
  const int by = blockDim.y;
  const int64_t col = chunk * p.bx + threadIdx.x;
  const float2 st = stats[n * p.groups + col / p.vpg];  // (mean, rstd) of this column's group
  Frag scale, shift;
  Frag fw, fb;
  if (kWeight) fw = IO::widen(reinterpret_cast<const Vec*>(weight)[col]);
  if (kBias) fb = IO::widen(reinterpret_cast<const Vec*>(bias)[col]);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    scale[j] = kWeight ? st.y * fw[j] : st.y;
    shift[j] = kBias ? fb[j] : 0.f;
  }
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
      if (k < valid) {
        const Frag f = IO::widen(v[k]);
        Frag o;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          float r = (f[j] - st.x) * scale[j] + shift[j];
          if (kSilu) r = r / (1.f + __expf(-r));
          o[j] = r;
        }
        y[first + k * step] = IO::narrow(o);
      }
    }
  }
}

template <typename T, int kVec, bool kWeight, bool kBias, bool kSilu>
int run(const CoGroupNormArgs& a, cudaStream_t stream) {
  if (a.n == 0) return CO_OK;  // empty output: nothing to launch
  Plan p;
  if (!make_plan(a, kVec, p)) return CO_CANNOT_IMPLEMENT;
  const uintptr_t align = uintptr_t(kVec * sizeof(T));
  auto aligned = [align](const void* q) { return reinterpret_cast<uintptr_t>(q) % align == 0; };
  if (a.input == nullptr || a.output == nullptr || !aligned(a.input) || !aligned(a.output))
    return CO_CANNOT_IMPLEMENT;
  if (kWeight && (a.weight == nullptr || !aligned(a.weight))) return CO_CANNOT_IMPLEMENT;
  if (kBias && (a.bias == nullptr || !aligned(a.bias))) return CO_CANNOT_IMPLEMENT;
  if (a.workspace == nullptr || reinterpret_cast<uintptr_t>(a.workspace) % 16 != 0 ||
      a.workspace_bytes < workspace_bytes(a.n, p))
    return CO_WORKSPACE_TOO_SMALL;
  float2* stats = static_cast<float2*>(a.workspace);
  float* partials = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + stats_bytes(a.n, p));
  const dim3 grid(unsigned(a.n * p.chunks * p.tiles)), block(unsigned(p.bx), unsigned(p.by));
  const T* x = static_cast<const T*>(a.input);
  group_norm_stats<T, kVec><<<grid, block, 0, stream>>>(x, partials, stats, p, a.eps);
  if (p.tiles > 1) {
    const int64_t count = a.n * p.groups;
    const int64_t blocks = (count * 32 + 255) / 256;
    group_norm_finalize<256><<<dim3(unsigned(blocks)), dim3(256), 0, stream>>>(
        partials, stats, count, p.tiles, a.eps);
  }
  group_norm_apply<T, kVec, kWeight, kBias, kSilu><<<grid, block, 0, stream>>>(
      x, static_cast<const T*>(a.weight), static_cast<const T*>(a.bias), static_cast<T*>(a.output),
      stats, p);
  if (cudaGetLastError() != cudaSuccess) return CO_LAUNCH_FAILED;
  return CO_OK;
}

template <int kVec>
int64_t workspace_size(const CoGroupNormArgs& a) {
  Plan p;
  if (a.n < 1 || !make_plan(a, kVec, p)) return 0;
  return workspace_bytes(a.n, p);
}

}  // namespace co_nhwc_group_norm
#endif  // CO_NHWC_GROUP_NORM_COMMON_
"""

_KERNEL = """\
namespace ${name} {

int64_t workspace_size(const CoGroupNormArgs& args) {
  return co_nhwc_group_norm::workspace_size<${vec}>(args);
}

int run(const CoGroupNormArgs& args, cudaStream_t stream) {
  return co_nhwc_group_norm::run<${element}, ${vec}, ${weight}, ${bias}, ${silu}>(args, stream);
}

}  // namespace ${name}
"""


def check(kernel: GroupNormKernel) -> None:
    """Raise ValueError unless this family can build ``kernel``."""
    if kernel.config.family != FAMILY:
        raise ValueError(f"{kernel.name}: not a {FAMILY} kernel")
    if kernel.vec * _BYTES[kernel.dtype] > 16:
        raise ValueError(f"{kernel.name}: vectors are at most 16 bytes")


def emit(kernel: GroupNormKernel) -> KernelSource:
    """The KernelSource of one group_norm kernel: ``namespace <kernel.name> {
    int64_t workspace_size(const CoGroupNormArgs&); int run(const CoGroupNormArgs&,
    cudaStream_t); }`` (run returns a CoStatus), preceded by the shared kernel
    templates (guarded: one copy per translation unit)."""
    check(kernel)

    def flag(b):
        return "true" if b else "false"
    body = Template(_KERNEL).substitute(
        name=kernel.name, element=_ELEMENT[kernel.dtype], vec=kernel.vec,
        weight=flag(kernel.weight), bias=flag(kernel.bias), silu=flag(kernel.silu))
    return KernelSource(name=kernel.name, includes=INCLUDES, code=_COMMON + "\n" + body,
                        args_type="CoGroupNormArgs")
