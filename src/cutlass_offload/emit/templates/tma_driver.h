// TMA descriptor encodes through a driver entry point looked up once per process.
//
// CUTLASS reaches cuTensorMapEncodeTiled / cuTensorMapEncodeIm2col through
// CUTLASS_CUDA_DRIVER_WRAPPER_CALL (cutlass/cuda_host_adapter.hpp), which without
// CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL asks the runtime for the entry point
// (cudaGetDriverEntryPointByVersion) on every encode: every launch of a TMA kernel
// builds 2-4 descriptors in to_underlying_arguments, so the lookup is paid per
// descriptor per call (NVIDIA/cutlass issue #3003). Linking libcuda directly
// (the DIRECT define) would make the library fail to load on a machine without a
// driver, where it is still built and inspected. So: the same lookup, done on
// first use and kept (a failed lookup is not kept: the next call asks again).
//
// Inlined by emit_unit before the TU's includes: the macro must be redefined after
// cuda_host_adapter.hpp defines it and before cute's TMA headers expand it.
#ifndef CO_TMA_DRIVER_H
#define CO_TMA_DRIVER_H
#include <atomic>
#include <cutlass/cuda_host_adapter.hpp>

namespace co_driver {

// The driver's ``symbol`` at ABI version ``version``, or nullptr.
inline void* entry_point(const char* symbol, unsigned int version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status;
#if (__CUDACC_VER_MAJOR__ > 12)
  cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &status);
#else
  (void)version;
  cudaError_t err = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &status);
#endif
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return fn;
}

template <typename... Args>
inline CUresult call_cuTensorMapEncodeTiled(Args... args) {
  static std::atomic<void*> slot{nullptr};
  void* fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = entry_point("cuTensorMapEncodeTiled", 12000);
    if (fn == nullptr) {
      return CUDA_ERROR_UNKNOWN;
    }
    slot.store(fn, std::memory_order_release);
  }
  return reinterpret_cast<decltype(&::cuTensorMapEncodeTiled)>(fn)(args...);
}

template <typename... Args>
inline CUresult call_cuTensorMapEncodeIm2col(Args... args) {
  static std::atomic<void*> slot{nullptr};
  void* fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = entry_point("cuTensorMapEncodeIm2col", 12000);
    if (fn == nullptr) {
      return CUDA_ERROR_UNKNOWN;
    }
    slot.store(fn, std::memory_order_release);
  }
  return reinterpret_cast<decltype(&::cuTensorMapEncodeIm2col)>(fn)(args...);
}

}  // namespace co_driver

#undef CUTLASS_CUDA_DRIVER_WRAPPER_CALL
#define CUTLASS_CUDA_DRIVER_WRAPPER_CALL(func) co_driver::call_##func
#endif  // CO_TMA_DRIVER_H
