// cutlass_offload: the direct depthwise conv2d fprop kernel (emit/depthwise.py,
// families/depthwise.py), hand-written CUDA over CUTLASS's numeric types. Inlined
// once into each translation unit that holds such a kernel, after the CUTLASS
// includes; templates only, so an instantiation in two objects of one library
// links once.
//
// y[n, p, q, c] = epilogue(sum_{r, s} x[n, p*stride_h - pad_h + r, q*stride_w - pad_w + s, c]
//                                   * filter[c, r, s])
// NHWC x and y, the (C, 1, R, S) filter as PyTorch holds it (KRSC with one input
// channel per group), fp32 accumulation, zero outside the image, dilation 1.
//
// Why not CUTLASS's own depthwise kernel: its 2.x direct conv ran 2-155x slower
// than cuDNN on the H200 (benchmarks/depthwise). A depthwise conv is bound by
// memory: each output reads R*S inputs of its own channel and nothing else, so it
// needs no tensor cores, only wide loads that neighbouring outputs share.
//
// Work of one thread: 8 consecutive channels (one 16-byte vector) of QT outputs
// along a row (q0 .. q0 + QT - 1). Per filter row r it loads the (QT - 1) * SW + S
// input vectors those outputs' windows span once into registers and reuses each for
// every tap that reads it; a block is (channel vectors) x (pixel groups), channels
// fastest, so a warp's loads are whole 16-byte sectors of neighbouring pixels, and
// the windows of neighbouring groups overlap in L1. The block's filter slice
// (R * S taps x its channels) is staged once in shared memory, tap-major, so each
// tap is one 16-byte shared load.
#ifndef CO_DEPTHWISE_COMMON_
#define CO_DEPTHWISE_COMMON_
namespace co_depthwise {

constexpr int kVec = 8;              // channels per thread: 16 bytes of 16-bit elements
constexpr int kMaxVectorsPerBlock = 16;
// threads per block (at most): a thread holds ~130 registers (its input window and
// accumulators), so 128-thread blocks let three blocks share an SM where 256-thread
// ones fit one (H200: geomean over the zoo's 16 depthwise convs 1.16x -> 1.21x cuDNN,
// benchmarks/depthwise_latency.py)
constexpr int kThreads = 128;
constexpr int kMaxTaps = 81;         // R * S: the filter slice stays within 21 KB of shared memory
// Pixel-group rounds per block (the kernel's Rounds): a block stages its filter slice
// once for that many rounds of outputs. With 25 or more taps the staging costs about
// what the block's outputs do, and 4 rounds ran the H200's 5x5 and 7x7 depthwise convs
// of convnext-tiny / efficientnet-b0 10-25% faster, but 3x3s and grids left with fewer
// blocks than SMs up to 1.7x slower (benchmarks/depthwise_latency.py, session 17): so
// 4 rounds only for 25+ taps where the grid keeps a block per SM.
constexpr int kRounds = 4;
constexpr int kRoundsMinTaps = 25;

// Codes of the epilogue (ir.GemmEpilogue): D = post(residual_op(activation(acc + bias), C))
enum Activation {
  kIdentity = 0, kRelu = 1, kGeluErf = 2, kGeluTanh = 3, kSilu = 4, kSigmoid = 5,
  kHardSwish = 6, kHardSigmoid = 7, kQuickGelu = 8
};
enum Residual { kNone = 0, kAdd = 1, kMul = 2 };

struct Geometry {
  int n, h, w, c, p, q, r;
  int pad_h, pad_w, stride_h;
  int q_tiles;          // ceil(q / QT)
};

template <int Act>
__host__ __device__ __forceinline__ float activate(float v) {
  if (Act == kRelu) return v > 0.f ? v : 0.f;         // NaN stays NaN, as torch.relu
  // GELU, SiLU, sigmoid, quick_gelu: the GEMM epilogues' functors (activations.h,
  // this unit's preamble), the same values as there and no IEEE divide or erff
  if (Act == kGeluErf) return co_act::GELU<float>{}(v);
  if (Act == kGeluTanh) {
    // sqrt(2 / pi) and 0.044715: torch.nn.functional.gelu(approximate="tanh")
    return 0.5f * v * (1.f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
  }
  if (Act == kSilu) return co_act::SiLU<float>{}(v);
  if (Act == kSigmoid) return co_act::Sigmoid<float>{}(v);
  // torch.nn.functional.hardswish / hardsigmoid
  if (Act == kHardSwish) return v * fminf(fmaxf(v + 3.f, 0.f), 6.f) / 6.f;
  if (Act == kHardSigmoid) return v != v ? v : fminf(fmaxf(v + 3.f, 0.f), 6.f) / 6.f;
  if (Act == kQuickGelu) return co_act::QuickGELU<float>{}(v);
  return v;
}

template <typename T>
__host__ __device__ __forceinline__ void load8(const T* p, float (&v)[kVec]) {
  const cutlass::AlignedArray<T, kVec> a = *reinterpret_cast<const cutlass::AlignedArray<T, kVec>*>(p);
#pragma unroll
  for (int e = 0; e < kVec; ++e) v[e] = float(a[e]);
}

// The accumulators of one thread: QT outputs x 8 channels of pixel (n, p, q0 ..),
// channels c0 .. c0 + 7; ``taps(i, w)`` gives the 8 filter values of tap i = r * S + s.
// Host and device: tests/build compile this on the host against a direct loop.
template <typename T, int S, int SW, int QT, typename Taps>
__host__ __device__ __forceinline__ void accumulate(const T* __restrict__ x, const Geometry& g, int n,
                                                    int p, int q0, int c0, const Taps& taps,
                                                    float (&acc)[QT][kVec]) {
  constexpr int kCols = (QT - 1) * SW + S;
#pragma unroll
  for (int t = 0; t < QT; ++t) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[t][e] = 0.f;
  }
  const int w0 = q0 * SW - g.pad_w;
  for (int r = 0; r < g.r; ++r) {
    const int hh = p * g.stride_h - g.pad_h + r;
    if (unsigned(hh) >= unsigned(g.h)) continue;      // a zero row of the padding
    const T* row = x + (int64_t(n) * g.h + hh) * int64_t(g.w) * g.c + c0;
    float win[kCols][kVec];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int ww = w0 + j;
      if (unsigned(ww) < unsigned(g.w)) {
        load8(row + int64_t(ww) * g.c, win[j]);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) win[j][e] = 0.f;
      }
    }
#pragma unroll
    for (int s = 0; s < S; ++s) {
      float wt[kVec];
      taps(r * S + s, wt);
#pragma unroll
      for (int t = 0; t < QT; ++t) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[t][e] = fmaf(win[t * SW + s][e], wt[e], acc[t][e]);
      }
    }
  }
}

// One output vector: the epilogue in fp32, rounded once to T. ``bias`` / ``res``:
// the 8 values at this output's channels (bias) or position (residual), or null.
template <typename T, int Act, int Res, int Post>
__host__ __device__ __forceinline__ void finish(const float (&acc)[kVec], const T* bias, const T* res,
                                                T* out) {
  float b[kVec], c[kVec];
  if (bias != nullptr) {
    load8(bias, b);
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) b[e] = 0.f;
  }
  if (Res != kNone) load8(res, c);
  cutlass::AlignedArray<T, kVec> o;
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    float v = activate<Act>(acc[e] + b[e]);
    if (Res == kAdd) v = v + c[e];
    if (Res == kMul) v = v * c[e];
    if (Post == kRelu) v = v > 0.f ? v : 0.f;
    o[e] = T(v);
  }
  *reinterpret_cast<cutlass::AlignedArray<T, kVec>*>(out) = o;
}

template <typename T>
struct SharedTaps {
  const T* base;      // this thread's channels of tap 0
  int stride;         // elements from one tap to the next
  __device__ __forceinline__ void operator()(int tap, float (&w)[kVec]) const {
    load8(base + tap * stride, w);
  }
};

// The block's filter slice, tap-major, into shared memory: filter[c, r, s] is at
// c * R * S + tap, so the slice of channels c_base .. c_base + width - 1 is one
// contiguous run of width * rs elements. It is read as 16-byte vectors (run() checks
// the filter's alignment), all loads of a thread issued before their stores: staged
// one element per dependent load, this took longer than the block's own outputs on
// ConvNeXt / EfficientNet's 5x5 and 7x7 convs. ``tid`` of ``threads`` staging threads.
template <typename T>
__device__ __forceinline__ void stage_taps(const T* __restrict__ filter, T* taps, int c_base, int rs, int width,
                                           int tid, int threads) {
  const T* slice = filter + int64_t(c_base) * rs;
  for (int i0 = tid * kVec; i0 < rs * width; i0 += 4 * threads * kVec) {
    cutlass::AlignedArray<T, kVec> v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = i0 + u * threads * kVec;
      if (i < rs * width) v[u] = *reinterpret_cast<const cutlass::AlignedArray<T, kVec>*>(slice + i);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = i0 + u * threads * kVec;
      if (i >= rs * width) break;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const int cl = (i + e) / rs;
        taps[((i + e) - cl * rs) * width + cl] = v[u][e];
      }
    }
  }
}

template <typename T, int S, int SW, int QT, int Act, int Res, bool ResBroadcast, int Post, int Rounds>
__global__ void __launch_bounds__(kThreads) depthwise(const T* __restrict__ x, const T* __restrict__ filter,
                                                      const T* __restrict__ bias,
                                                      const T* __restrict__ residual, T* __restrict__ y,
                                                      Geometry g) {
  extern __shared__ __align__(16) unsigned char co_depthwise_smem[];
  T* taps = reinterpret_cast<T*>(co_depthwise_smem);
  const int cv = blockDim.x;                  // channel vectors per block
  const int width = cv * kVec;                // channels per block
  const int c_base = blockIdx.y * width;
  const int rs = g.r * S;
  stage_taps(filter, taps, c_base, rs, width, threadIdx.y * blockDim.x + threadIdx.x,
             blockDim.x * blockDim.y);
  __syncthreads();
  const int c0 = c_base + threadIdx.x * kVec;
  const int64_t groups = int64_t(g.n) * g.p * g.q_tiles;
  // Rounds pixel groups per thread, one block's worth apart: the staged slice serves
  // that many times the outputs
  for (int round = 0; round < Rounds; ++round) {
    const int64_t group = (int64_t(blockIdx.x) * Rounds + round) * blockDim.y + threadIdx.y;
    if (group >= groups) return;
    const int qt = int(group % g.q_tiles);
    const int64_t np = group / g.q_tiles;
    const int p = int(np % g.p);
    const int n = int(np / g.p);
    const int q0 = qt * QT;
    float acc[QT][kVec];
    accumulate<T, S, SW, QT>(x, g, n, p, q0, c0, SharedTaps<T>{taps + threadIdx.x * kVec, width}, acc);
    const int64_t out_row = (int64_t(n) * g.p + p) * g.q;
#pragma unroll
    for (int t = 0; t < QT; ++t) {
      const int q = q0 + t;
      if (q >= g.q) break;
      const int64_t at = (out_row + q) * g.c + c0;
      const T* res = Res == kNone ? nullptr : (ResBroadcast ? residual + c0 : residual + at);
      finish<T, Act, Res, Post>(acc[t], bias == nullptr ? nullptr : bias + c0, res, y + at);
    }
  }
}

// Channel vectors per block: all of C / 8 when they fit, else the largest divisor
// of C / 8 that does (so no block has idle channel lanes).
inline int vectors_per_block(int vectors) {
  for (int cv = vectors < kMaxVectorsPerBlock ? vectors : kMaxVectorsPerBlock; cv > 1; --cv) {
    if (vectors % cv == 0) return cv;
  }
  return 1;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// What every form of the kernel computes: depthwise (K = C, one filter channel), the
// compiled filter width and horizontal stride, dilation 1, C a whole number of 16-byte
// vectors, 16-byte aligned operands; sizes whose offsets fit the kernels' 32-bit
// per-row math. CO_OK with ``g`` filled in, else CO_CANNOT_IMPLEMENT.
template <int S, int SW, int Res>
int check(const CoConvArgs& a, Geometry& g) {
  if (a.k != a.c || a.c % kVec != 0 || a.s != S || a.stride_w != SW || a.dilation_h != 1 ||
      a.dilation_w != 1 || a.r < 1 || a.r * S > kMaxTaps || a.stride_h < 1 || a.n < 0 ||
      a.h < 1 || a.w < 1 || a.p < 1 || a.q < 1 || a.pad_h < 0 || a.pad_w < 0) {
    return CO_CANNOT_IMPLEMENT;
  }
  const int64_t ext[] = {a.n, a.h, a.w, a.c, a.p, a.q, a.pad_h, a.pad_w, a.stride_h,
                         a.p * a.stride_h + a.r, a.q * SW + S, a.w * a.c};
  for (int64_t v : ext) {
    if (v > INT32_MAX) return CO_CANNOT_IMPLEMENT;
  }
  if (!aligned16(a.x) || !aligned16(a.y) || !aligned16(a.filter) || (a.bias != nullptr && !aligned16(a.bias)) ||
      (Res != kNone && (a.residual == nullptr || !aligned16(a.residual)))) {
    return CO_CANNOT_IMPLEMENT;
  }
  g.n = int(a.n); g.h = int(a.h); g.w = int(a.w); g.c = int(a.c); g.p = int(a.p); g.q = int(a.q);
  g.r = int(a.r); g.pad_h = int(a.pad_h); g.pad_w = int(a.pad_w); g.stride_h = int(a.stride_h);
  g.q_tiles = 0;
  return CO_OK;
}

// The row form: each thread QT outputs of one row, its input window from global memory.
template <typename T, int S, int SW, int QT, int Act, int Res, bool ResBroadcast, int Post>
int run_rows(const CoConvArgs& a, Geometry g, cudaStream_t stream) {
  g.q_tiles = (g.q + QT - 1) / QT;
  const int cv = vectors_per_block(g.c / kVec);
  const int pg = kThreads / cv;
  const int64_t groups = int64_t(g.n) * g.p * g.q_tiles;
  const int64_t slices = g.c / (cv * kVec);
  const int sms = co_device_info().sm_count > 0 ? co_device_info().sm_count : 132;  // prelude.h
  const bool rounds = g.r * S >= kRoundsMinTaps &&
                      (groups + pg - 1) / pg * slices >= int64_t(kRounds) * sms;
  const int64_t per_block = int64_t(pg) * (rounds ? kRounds : 1);
  const int64_t blocks = (groups + per_block - 1) / per_block;
  if (blocks > INT32_MAX || slices > 65535) return CO_CANNOT_IMPLEMENT;    // grid x / y limits
  const dim3 grid{unsigned(blocks), unsigned(slices)};
  const dim3 block(cv, pg);
  const size_t smem = size_t(g.r) * S * cv * kVec * sizeof(T);
  const T* x = static_cast<const T*>(a.x);
  const T* filter = static_cast<const T*>(a.filter);
  const T* bias = static_cast<const T*>(a.bias);
  const T* residual = static_cast<const T*>(a.residual);
  T* y = static_cast<T*>(a.y);
  if (rounds) {
    depthwise<T, S, SW, QT, Act, Res, ResBroadcast, Post, kRounds><<<grid, block, smem, stream>>>(
        x, filter, bias, residual, y, g);
  } else {
    depthwise<T, S, SW, QT, Act, Res, ResBroadcast, Post, 1><<<grid, block, smem, stream>>>(
        x, filter, bias, residual, y, g);
  }
  if (cudaGetLastError() != cudaSuccess) return CO_LAUNCH_FAILED;
  return CO_OK;
}

}  // namespace co_depthwise
#endif  // CO_DEPTHWISE_COMMON_
