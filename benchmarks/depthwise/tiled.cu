// The depthwise kernel's two forms side by side (templates/depthwise.cuh row form,
// templates/depthwise_tiled.cuh tiled form at several shapes), for tiled_bench.py.
// Build (GPU machine or not; the .so needs a GPU to run): benchmarks/depthwise/build_tiled.sh
#include <cuda_runtime.h>
#include "cutlass/cutlass.h"
#include "cutlass/array.h"
#include "cutlass/numeric_types.h"
#include "prelude.h"
#include "depthwise.cuh"
#include "depthwise_tiled.cuh"

using T = cutlass::half_t;
using namespace co_depthwise;

// variant 0: the row form (QT 4 for 7-wide filters, else 2: families/depthwise.py);
// variant i > 0: the tiled form at tiled_bench.TILED[i - 1] = (PT, QT, threads, min_blocks)
template <int S, int SW, int Act>
static int dispatch(int variant, const CoConvArgs& a, cudaStream_t st) {
  Geometry g;
  if (check<S, SW, kNone>(a, g) != CO_OK) return CO_CANNOT_IMPLEMENT;
  switch (variant) {
    case 0: return run_rows<T, S, SW, (S >= 7 ? 4 : 2), Act, kNone, false, kIdentity>(a, g, st);
    case 1: return run_tiled<T, S, SW, 2, 2, Act, kNone, false, kIdentity, 256, 1>(a, g, st);
    case 2: return run_tiled<T, S, SW, 1, 4, Act, kNone, false, kIdentity, 256, 1>(a, g, st);
    case 3: return run_tiled<T, S, SW, 4, 1, Act, kNone, false, kIdentity, 256, 1>(a, g, st);
    case 4: return run_tiled<T, S, SW, 1, 4, Act, kNone, false, kIdentity, 128, 4>(a, g, st);
    case 5: return run_tiled<T, S, SW, 2, 2, Act, kNone, false, kIdentity, 128, 4>(a, g, st);
    case 6: return run_tiled<T, S, SW, 1, 2, Act, kNone, false, kIdentity, 128, 4>(a, g, st);
    case 7: return run_tiled<T, S, SW, 1, 4, Act, kNone, false, kIdentity, 256, 2>(a, g, st);
    case 8: return run_tiled<T, S, SW, 2, 2, Act, kNone, false, kIdentity, 256, 2>(a, g, st);
    case 9: return run_tiled<T, S, SW, 4, 1, Act, kNone, false, kIdentity, 128, 4>(a, g, st);
  }
  return CO_CANNOT_IMPLEMENT;
}

// One translation unit per filter (-DDW_PART=k, k = 0..4, compiled in parallel) and
// one with the entry (-DDW_PART=-1): the variants of a filter are one unit's work.
#define DW_FILTERS(X) X(0, 7, 1, kIdentity, 710) X(1, 3, 1, kSilu, 311) X(2, 3, 2, kSilu, 321) \
  X(3, 5, 1, kSilu, 511) X(4, 5, 2, kSilu, 521)
#if DW_PART >= 0
#define DW_DEFINE(part, S, SW, Act, key)                                                  \
  extern "C" int dw_tiled_##key(int variant, const CoConvArgs* a, cudaStream_t st) {       \
    return dispatch<S, SW, Act>(variant, *a, st);                                         \
  }
#if DW_PART == 0
DW_DEFINE(0, 7, 1, kIdentity, 710)
#elif DW_PART == 1
DW_DEFINE(1, 3, 1, kSilu, 311)
#elif DW_PART == 2
DW_DEFINE(2, 3, 2, kSilu, 321)
#elif DW_PART == 3
DW_DEFINE(3, 5, 1, kSilu, 511)
#elif DW_PART == 4
DW_DEFINE(4, 5, 2, kSilu, 521)
#endif
#else
#define DW_DECLARE(part, S, SW, Act, key) extern "C" int dw_tiled_##key(int, const CoConvArgs*, cudaStream_t);
DW_FILTERS(DW_DECLARE)

extern "C" int dw_tiled_run(int variant, int silu, const CoConvArgs* a, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (int(a->s) * 100 + int(a->stride_w) * 10 + silu) {
#define DW_CASE(part, S, SW, Act, key) \
    case key: return dw_tiled_##key(variant, a, st);
    DW_FILTERS(DW_CASE)
  }
  return CO_CANNOT_IMPLEMENT;
}
#endif
