// Host cost of one TMA descriptor encode, as CUTLASS 4.2 makes it and as
// emit/templates/tma_driver.h makes it (issue 17: launch cost).
//
// CUTLASS without CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL looks the driver's
// cuTensorMapEncodeTiled up (cudaGetDriverEntryPointByVersion) before every encode;
// every launch of one of our sm90 kernels encodes 2-4 descriptors. Prints
// microseconds per lookup, per encode through a kept pointer, and per lookup +
// encode; writes nothing else. Needs a GPU (the driver must be initialized).
//
//   nvcc -O2 -std=c++17 -o /tmp/tma_encode_cost benchmarks/tma_encode_cost.cu && /tmp/tma_encode_cost
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>

static void* lookup() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status) !=
          cudaSuccess || status != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return fn;
}

static CUresult encode(void* fn, CUtensorMap* map, void* base) {
  // a (4096, 4096) fp16 row-major operand, 64 x 64 boxes, 128-byte swizzle: a GEMM A tile
  cuuint64_t dims[2] = {4096, 4096};
  cuuint64_t strides[1] = {4096 * 2};
  cuuint32_t box[2] = {64, 64};
  cuuint32_t estr[2] = {1, 1};
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)(
      map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

template <class F>
static double us_per_call(F f, int n) {
  for (int i = 0; i < n / 10; ++i) f();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  std::chrono::duration<double, std::micro> dt = std::chrono::steady_clock::now() - t0;
  return dt.count() / n;
}

int main() {
  void* base = nullptr;
  if (cudaMalloc(&base, 4096 * 4096 * 2) != cudaSuccess) {
    std::printf("no GPU\n");
    return 2;
  }
  void* fn = lookup();
  if (fn == nullptr) {
    std::printf("no cuTensorMapEncodeTiled entry point\n");
    return 2;
  }
  CUtensorMap map;
  if (encode(fn, &map, base) != CUDA_SUCCESS) {
    std::printf("encode failed\n");
    return 1;
  }
  const int n = 100000;
  double lookup_us = us_per_call([] { (void)lookup(); }, n);
  double encode_us = us_per_call([&] { (void)encode(fn, &map, base); }, n);
  double both_us = us_per_call([&] { (void)encode(lookup(), &map, base); }, n);
  std::printf("{\"lookup_us\": %.3f, \"encode_kept_pointer_us\": %.3f, \"lookup_and_encode_us\": %.3f}\n",
              lookup_us, encode_us, both_us);
  return 0;
}
