// cutlass_offload C ABI: shared by every generated library.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

// Arguments of one GEMM call. Element offsets, not bytes.
//   A[l, m, k] = a + l * batch_stride_a + m * lda + k                (row-major)
//   B[l, k, n] = b + l * batch_stride_b + n * ldb + k   if B is col-major
//              = b + l * batch_stride_b + k * ldb + n   if B is row-major
//   C[l, m, n] = c + l * batch_stride_c + m * ldc + n   (residual source, may be null)
//   D[l, m, n] = d + l * batch_stride_d + m * ldd + n
//   bias[n]    = bias + n                                (may be null)
// A batch stride of 0 broadcasts that operand over the batch.
struct CoGemmArgs {
  const void* a;
  const void* b;
  const void* bias;
  const void* c;
  void* d;
  int64_t m, n, k, l;
  int64_t lda, ldb, ldc, ldd;
  int64_t batch_stride_a, batch_stride_b, batch_stride_c, batch_stride_d;
  void* workspace;
  int64_t workspace_bytes;
};

// Status codes returned by every launcher.
enum CoStatus : int {
  CO_OK = 0,
  CO_CANNOT_IMPLEMENT = 1,   // the kernel cannot run this problem (caller falls back)
  CO_WORKSPACE_TOO_SMALL = 2,
  CO_INIT_FAILED = 3,
  CO_LAUNCH_FAILED = 4,
};
