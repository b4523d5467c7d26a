// The depthwise kernel's two forms side by side (templates/depthwise.cuh row form,
// templates/depthwise_tiled.cuh tiled form at several shapes), for tiled_bench.py.
// Build (GPU machine or not; the .so needs a GPU to run):
//   nvcc -std=c++17 -O3 -arch=sm_90a -Xcompiler -fPIC -shared benchmarks/depthwise/tiled.cu \
//     -o benchmarks/depthwise/libdwtiled.so -I$CL/include -Isrc/cutlass_offload/emit/templates
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

extern "C" int dw_tiled_run(int variant, int silu, const CoConvArgs* a, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int key = int(a->s) * 100 + int(a->stride_w) * 10 + silu;
  switch (key) {
    case 710: return dispatch<7, 1, kIdentity>(variant, *a, st);
    case 311: return dispatch<3, 1, kSilu>(variant, *a, st);
    case 321: return dispatch<3, 2, kSilu>(variant, *a, st);
    case 511: return dispatch<5, 1, kSilu>(variant, *a, st);
    case 521: return dispatch<5, 2, kSilu>(variant, *a, st);
  }
  return CO_CANNOT_IMPLEMENT;
}
