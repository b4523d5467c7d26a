// cutlass_offload: the tiled form of the direct depthwise conv2d fprop kernel
// (after depthwise.cuh, which has the epilogue, the filter staging and the row form).
//
// Why a second form: the row form reads each thread's input window from global
// memory, one filter row after another, so every input is fetched by R output rows
// and by neighbouring windows through L1, and each filter row waits out a load's
// latency. Here a block first copies the input tile its outputs read (the tile's
// receptive field, all of the block's channel vectors; zeros outside the image) into
// shared memory with cp.async, every copy in flight at once, and its threads then
// compute from shared memory: each thread PT x QT outputs of one channel vector,
// every input row of its window loaded once into registers and used by each of its
// output rows that reads it. Square filters and strides only (R = S, stride_h =
// stride_w, compiled in, so every loop unrolls); the row form runs the rest.
//
// Shared memory: the filter slice (tap-major, as the row form stages it), then the
// input tile, row-major over (row, column), each column's cv channel vectors
// contiguous. The column pitch m (in 16-byte vectors) is padded so that 8
// neighbouring threads (one shared-memory wavefront of 16-byte loads) hit 8 distinct
// bank groups: thread t = v + cv * j reads vector v of column j * QT * SW, at
// v + j * QT * SW * m, which is t mod 8 when QT * SW * m = cv (mod 8).
#ifndef CO_DEPTHWISE_TILED_
#define CO_DEPTHWISE_TILED_
#include "cutlass/arch/memory_sm80.h"

namespace co_depthwise {

constexpr int kTiledThreads = 256;       // threads per block, at most
constexpr int kTiledSmem = 48 * 1024;    // dynamic shared memory per block, at most (no opt-in)
constexpr int kTiledVectors = 8;         // channel vectors per block, at most

struct Tiling {
  int cv, tq, tp;        // block: cv channel vectors x tq x tp thread groups (q, p)
  int ih, iw;            // input tile rows and columns
  int m;                 // column pitch, 16-byte vectors
  int tiles_p, tiles_q;  // output tiles per image
  int taps_elems;        // elements of the staged filter slice (the tile follows)
};

// Column pitch (16-byte vectors) for cv vectors per column and a step of `step`
// columns between neighbouring thread groups (QT * SW): the least m >= cv with
// step * m = cv (mod 8), or cv when there is none.
__host__ __device__ inline int tile_pitch(int cv, int step) {
  for (int m = cv; m < cv + 8; ++m) {
    if ((step * m - cv) % 8 == 0) return m;
  }
  return cv;
}

// Dynamic shared memory of a block: the filter slice and the input tile.
template <typename T>
__host__ __device__ inline size_t tiling_smem_bytes(const Tiling& t) {
  return (size_t(t.taps_elems) + size_t(t.ih) * t.iw * t.m * kVec) * sizeof(T);
}

// The block shape for a problem: channel vectors, then up to 8 thread groups along a
// row, then as many along the height as Threads and kTiledSmem allow. False when even
// one row of groups does not fit the shared memory.
template <typename T, int S, int SW, int PT, int QT, int Threads = kTiledThreads>
bool plan_tiling(const Geometry& g, Tiling& t) {
  int cv = kTiledVectors;
  const int vectors = g.c / kVec;
  while (vectors % cv) --cv;
  t.cv = cv;
  t.tq = (g.q + QT - 1) / QT;
  if (t.tq > 8) t.tq = 8;
  int tp = (g.p + PT - 1) / PT;
  const int tp_threads = Threads / (cv * t.tq);
  if (tp > tp_threads) tp = tp_threads;
  t.m = tile_pitch(cv, QT * SW);
  t.taps_elems = S * S * cv * kVec;
  t.iw = (t.tq * QT - 1) * SW + S;
  for (; tp >= 1; --tp) {
    t.ih = (tp * PT - 1) * SW + S;
    if (tiling_smem_bytes<T>(t) <= size_t(kTiledSmem)) break;
  }
  if (tp < 1) return false;
  t.tp = tp;
  t.tiles_p = (g.p + tp * PT - 1) / (tp * PT);
  t.tiles_q = (g.q + t.tq * QT - 1) / (t.tq * QT);
  return true;
}

// Where block ``block`` (of n x tiles_p x tiles_q, tiles fastest) works: its image, its
// first output row and column, and its tile's first input row and column.
struct TileOrigin {
  int n, p0, q0, h0, w0;
};

template <int SW, int PT, int QT>
__host__ __device__ inline TileOrigin tile_origin(const Geometry& g, const Tiling& t, int block) {
  TileOrigin o;
  const int tq_i = block % t.tiles_q;
  block /= t.tiles_q;
  const int tp_i = block % t.tiles_p;
  o.n = block / t.tiles_p;
  o.p0 = tp_i * t.tp * PT;
  o.q0 = tq_i * t.tq * QT;
  o.h0 = o.p0 * SW - g.pad_h;
  o.w0 = o.q0 * SW - g.pad_w;
  return o;
}

// Element offset of tile cell (row, col), channel vector v, from the tile's start.
__host__ __device__ inline int tile_offset(const Tiling& t, int row, int col, int v) {
  return ((row * t.iw + col) * t.m + v) * kVec;
}

// Element offset in x of the tile cell (row, col) at channel c, or -1 outside the image.
__host__ __device__ inline int64_t tile_source(const Geometry& g, const TileOrigin& o, int row, int col,
                                               int c) {
  const int hh = o.h0 + row, ww = o.w0 + col;
  if (unsigned(hh) >= unsigned(g.h) || unsigned(ww) >= unsigned(g.w)) return -1;
  return ((int64_t(o.n) * g.h + hh) * g.w + ww) * g.c + c;
}

// One thread's outputs from a staged tile: PT x QT outputs of channel vector v whose
// windows start at tile row row0 and column col0 (``tile``: the tile's first element;
// row pitch iw * m * kVec, column pitch m * kVec elements). Host and device: tests/build
// stage a tile on the host and check this against a direct loop.
template <typename T, int S, int SW, int PT, int QT, typename Taps>
__host__ __device__ __forceinline__ void accumulate_tile(const T* tile, const Tiling& t, int row0, int col0,
                                                         int v, const Taps& taps,
                                                         float (&acc)[PT][QT][kVec]) {
  constexpr int kCols = (QT - 1) * SW + S;
  constexpr int kRows = (PT - 1) * SW + S;
#pragma unroll
  for (int i = 0; i < PT; ++i)
#pragma unroll
    for (int j = 0; j < QT; ++j)
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[i][j][e] = 0.f;
  const int col_pitch = t.m * kVec;
  const int row_pitch = t.iw * col_pitch;
  const T* base = tile + row0 * row_pitch + col0 * col_pitch + v * kVec;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    float win[kCols][kVec];
#pragma unroll
    for (int j = 0; j < kCols; ++j) load8(base + i * row_pitch + j * col_pitch, win[j]);
#pragma unroll
    for (int pt = 0; pt < PT; ++pt) {
      const int r = i - pt * SW;           // the filter row output row pt reads here
      if (r < 0 || r >= S) continue;
#pragma unroll
      for (int s = 0; s < S; ++s) {
        float wt[kVec];
        taps(r * S + s, wt);
#pragma unroll
        for (int qt = 0; qt < QT; ++qt)
#pragma unroll
          for (int e = 0; e < kVec; ++e)
            acc[pt][qt][e] = fmaf(win[qt * SW + s][e], wt[e], acc[pt][qt][e]);
      }
    }
  }
}

// Stage the input cells of the tile at ``o`` (cp.async, zeros outside the image), this
// thread's share of them: channel vector v, cells from ``first`` in steps of ``step``.
template <typename T>
__device__ __forceinline__ void stage_tile(const T* __restrict__ x, T* tile, const Geometry& g, const Tiling& t,
                                           const TileOrigin& o, int c, int v, int first, int step) {
  for (int cell = first; cell < t.ih * t.iw; cell += step) {
    const int row = cell / t.iw, col = cell - row * t.iw;
    const int64_t from = tile_source(g, o, row, col, c);
    cutlass::arch::cp_async_zfill<16>(tile + tile_offset(t, row, col, v), from < 0 ? x : x + from, from >= 0);
  }
}

// One thread's outputs of the tile at ``o`` from its staged tile, through the epilogue.
template <typename T, int S, int SW, int PT, int QT, int Act, int Res, bool ResBroadcast, int Post>
__device__ __forceinline__ void tile_outputs(const T* tile, const T* taps, const T* __restrict__ bias,
                                             const T* __restrict__ residual, T* __restrict__ y,
                                             const Geometry& g, const Tiling& t, const TileOrigin& o,
                                             int c_base, int v, int qg, int pgi) {
  float acc[PT][QT][kVec];
  accumulate_tile<T, S, SW, PT, QT>(tile, t, pgi * PT * SW, qg * QT * SW, v,
                                    SharedTaps<T>{taps + v * kVec, t.cv * kVec}, acc);
  const int c0 = c_base + v * kVec;
#pragma unroll
  for (int pt = 0; pt < PT; ++pt) {
    const int p = o.p0 + pgi * PT + pt;
    if (p >= g.p) break;
    const int64_t out_row = (int64_t(o.n) * g.p + p) * g.q;
#pragma unroll
    for (int qt = 0; qt < QT; ++qt) {
      const int q = o.q0 + qg * QT + qt;
      if (q >= g.q) break;
      const int64_t at = (out_row + q) * g.c + c0;
      const T* res = Res == kNone ? nullptr : (ResBroadcast ? residual + c0 : residual + at);
      finish<T, Act, Res, Post>(acc[pt][qt], bias == nullptr ? nullptr : bias + c0, res, y + at);
    }
  }
}

// One block per output tile (blockIdx.x: image and tile, blockIdx.y: channel slice).
// Blocks that walked several tiles, staging the next into a second buffer while
// computing one, ran slower on every problem measured (H200, the four "pipe" shapes of
// benchmarks/results/depthwise_tiled_2026-12-03_h200.*: 0.49-0.55x cuDNN's conv alone
// geomean, against 0.69-0.79x for these shapes one tile per block).
template <typename T, int S, int SW, int PT, int QT, int Act, int Res, bool ResBroadcast, int Post,
          int Threads, int MinBlocks>
__global__ void __launch_bounds__(Threads, MinBlocks) depthwise_tiled(
    const T* __restrict__ x, const T* __restrict__ filter, const T* __restrict__ bias,
    const T* __restrict__ residual, T* __restrict__ y, Geometry g, Tiling t) {
  extern __shared__ __align__(16) unsigned char co_depthwise_smem[];
  T* taps = reinterpret_cast<T*>(co_depthwise_smem);
  T* tile = taps + t.taps_elems;
  const int v = threadIdx.x, qg = threadIdx.y, pgi = threadIdx.z;
  const int c_base = blockIdx.y * t.cv * kVec;
  const int groups = t.tq * t.tp, first = pgi * t.tq + qg;
  const TileOrigin o = tile_origin<SW, PT, QT>(g, t, blockIdx.x);
  stage_tile(x, tile, g, t, o, c_base + v * kVec, v, first, groups);
  cutlass::arch::cp_async_fence();
  stage_taps(filter, taps, c_base, S * S, t.cv * kVec, first * t.cv + v, groups * t.cv);
  cutlass::arch::cp_async_wait<0>();
  __syncthreads();
  tile_outputs<T, S, SW, PT, QT, Act, Res, ResBroadcast, Post>(tile, taps, bias, residual, y, g, t, o, c_base,
                                                               v, qg, pgi);
}

// The tiled form for a checked problem (``check``): CO_CANNOT_IMPLEMENT when it does
// not apply (R != S, stride_h != stride_w, a tile that does not fit, a grid too large).
template <typename T, int S, int SW, int PT, int QT, int Act, int Res, bool ResBroadcast, int Post,
          int Threads = kTiledThreads, int MinBlocks = 1>
int run_tiled(const CoConvArgs& a, const Geometry& g, cudaStream_t stream) {
  if (g.r != S || g.stride_h != SW) return CO_CANNOT_IMPLEMENT;
  Tiling t;
  if (!plan_tiling<T, S, SW, PT, QT, Threads>(g, t)) return CO_CANNOT_IMPLEMENT;
  const int64_t blocks = int64_t(g.n) * t.tiles_p * t.tiles_q;
  const int slices = g.c / (t.cv * kVec);
  if (blocks > INT32_MAX || slices > 65535) return CO_CANNOT_IMPLEMENT;    // grid x / y limits
  const dim3 grid{unsigned(blocks), unsigned(slices)};
  const dim3 block(t.cv, t.tq, t.tp);
  depthwise_tiled<T, S, SW, PT, QT, Act, Res, ResBroadcast, Post, Threads, MinBlocks>
      <<<grid, block, tiling_smem_bytes<T>(t), stream>>>(
          static_cast<const T*>(a.x), static_cast<const T*>(a.filter), static_cast<const T*>(a.bias),
          static_cast<const T*>(a.residual), static_cast<T*>(a.y), g, t);
  if (cudaGetLastError() != cudaSuccess) return CO_LAUNCH_FAILED;
  return CO_OK;
}

// The kernel's entry (emit/depthwise.py): with TPT > 0 the tiled form (TPT x TQT
// outputs per thread, Threads per block at most, MinBlocks in its launch bounds) where
// it applies, else the row form with QT outputs per thread. CO_CANNOT_IMPLEMENT for
// what neither computes (``check``), CO_LAUNCH_FAILED from CUDA.
template <typename T, int S, int SW, int QT, int TPT, int TQT, int Threads, int MinBlocks, int Act, int Res,
          bool ResBroadcast, int Post>
int run(const CoConvArgs& a, cudaStream_t stream) {
  Geometry g;
  if (check<S, SW, Res>(a, g) != CO_OK) return CO_CANNOT_IMPLEMENT;
  if (a.n == 0) return CO_OK;
  if constexpr (TPT > 0) {
    const int tiled = run_tiled<T, S, SW, TPT, TQT, Act, Res, ResBroadcast, Post, Threads, MinBlocks>(a, g, stream);
    if (tiled != CO_CANNOT_IMPLEMENT) return tiled;
  }
  return run_rows<T, S, SW, QT, Act, Res, ResBroadcast, Post>(a, g, stream);
}

}  // namespace co_depthwise
#endif  // CO_DEPTHWISE_TILED_
