// cutlass_offload C ABI: shared by every generated library.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <type_traits>
#include <cuda_runtime.h>

// Arguments of one GEMM call. Element offsets, not bytes.
//   A[l, m, k] = a + l * batch_stride_a + m * lda + k                (row-major)
//   B[l, k, n] = b + l * batch_stride_b + n * ldb + k   if B is col-major
//              = b + l * batch_stride_b + k * ldb + n   if B is row-major
//   C[l, m, n] = c + l * batch_stride_c + m * ldc + n   (residual source, may be null)
//   D[l, m, n] = d + l * batch_stride_d + m * ldd + n
//   bias[n]    = bias + n                                (may be null)
// A batch stride of 0 broadcasts that operand over the batch.
// Launch knobs (CUTLASS 3.x kernels; 2.x kernels ignore them; 0 = CUTLASS's default):
//   raster_order   0 heuristic, 1 along M, 2 along N (the tile scheduler's walk)
//   swizzle        max swizzle size: 1, 2, 4 or 8 (0 = 1)
//   splits         split-K factor, stream-K scheduler kernels only (0 = 1)
//   decomposition  stream-K kernels: 0 heuristic, 1 data-parallel, 2 split-K, 3 stream-K
//   pdl            1: launch with programmatic dependent launch
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
  int32_t raster_order, swizzle, splits, decomposition, pdl;
};

// Arguments of one conv2d fprop call (implicit GEMM). Element offsets, not bytes.
// Every tensor is packed with the channel innermost (NHWC activations, KRSC filters):
//   x[n, h, w, c]      = x + ((n * H + h) * W + w) * C + c
//   filter[k, r, s, c] = filter + ((k * R + r) * S + s) * C + c
//   y[n, p, q, k]      = y + ((n * P + p) * Q + q) * K + k
//   bias[k]            = bias + k                         (may be null)
//   residual           = like y, or a (K,) vector when the kernel's residual is
//                        broadcast per channel              (may be null)
// pad_h / pad_w are the top / left padding; P and Q are given, so bottom / right
// padding is whatever makes them: (P - 1) * stride_h + dilation_h * (R - 1) + 1 - H - pad_h.
struct CoConvArgs {
  const void* x;
  const void* filter;
  const void* bias;
  const void* residual;
  void* y;
  int64_t n, h, w, c, k, r, s, p, q;
  int64_t pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
  void* workspace;
  int64_t workspace_bytes;
};

// Arguments of one row-wise normalization call (layer_norm / rms_norm over the
// last axis). Element offsets, not bytes. Rows are packed (row stride = cols):
//   input[r, c]  = input + r * cols + c
//   output[r, c] = output + r * cols + c
//   weight[c]    = weight + c                             (may be null: no scale)
//   bias[c]      = bias + c                               (may be null: no shift)
// eps is added to the variance (layer_norm) or the mean square (rms_norm).
// Norm kernels need no workspace; the fields are there for uniformity.
struct CoNormArgs {
  const void* input;
  const void* weight;
  const void* bias;
  void* output;
  int64_t rows, cols;
  float eps;
  void* workspace;
  int64_t workspace_bytes;
};

// Arguments of one group_norm call over an NHWC tensor (channel innermost, i.e. a
// channels_last PyTorch tensor). Element offsets, not bytes; packed:
//   input[n, h, w, c]  = input + ((n * H + h) * W + w) * C + c
//   output[n, h, w, c] = output + ((n * H + h) * W + w) * C + c
//   weight[c], bias[c] = weight + c, bias + c             (each may be null)
// Channels [g * C / groups, (g + 1) * C / groups) form group g; statistics per
// (n, group); eps is added to the variance. The workspace (workspace_size bytes)
// holds the per-group statistics; it needs no initialization.
struct CoGroupNormArgs {
  const void* input;
  const void* weight;
  const void* bias;
  void* output;
  int64_t n, h, w, c, groups;
  float eps;
  void* workspace;
  int64_t workspace_bytes;
};

// Arguments of one fused multi-head attention forward call (emit/attention.py):
// out = softmax(scale * q @ k^T + bias, causal mask) @ v, per (batch, head).
// Element offsets, not bytes. Q/K/V in the kernel's native BMHK order, any
// non-negative strides (0 broadcasts), head_dim contiguous:
//   q[b, i, h, d]   = q + b * q_stride_batch + i * q_stride_seq + h * q_stride_head + d
//   k[b, j, h, d]   = k + b * k_stride_batch + j * k_stride_seq + h * k_stride_head + d
//   v[b, j, h, e]   = v + b * v_stride_batch + j * v_stride_seq + h * v_stride_head + e
// A PyTorch (B, H, L, E) tensor is BMHK with strides (sB, sL, sH) = (stride(0), stride(2), stride(1)).
//   out[b, i, h, e] = out + b * out_stride_batch + i * out_stride_seq + h * out_stride_head + e
//     the kernel fixes out_stride_head = head_dim_v and out_stride_batch = seq_q * out_stride_seq
//     (checked; packed BMHK output always qualifies).
//   bias[b, h, i, j] = bias + b * bias_stride_batch + h * bias_stride_head + i * bias_stride_query + j
//     (may be null; stride 0 broadcasts; key stride 1). The kernel reads whole 16-byte
//     vectors: every bias row must be readable up to round_up(seq_kv, 16 bytes / element size)
//     elements; bias_kv_capacity says how many are (0 = seq_kv, i.e. no padding).
// scale: any float the kernel accepts (finite, > 0; otherwise CO_CANNOT_IMPLEMENT).
// causal: 0 none, 1 top-left (query i sees keys j <= i; PyTorch is_causal=True),
//         2 bottom-right (query i sees keys j <= i + seq_kv - seq_q; needs seq_q <= seq_kv).
// workspace: fp32 output accumulator of batch * seq_q * heads * head_dim_v elements for
//   kernels that keep it in global memory (head dims above the kernel's kKeysPerBlock);
//   <kernel>::workspace_size(args) says how many bytes; 16-byte aligned.
struct CoAttentionArgs {
  const void* q;
  const void* k;
  const void* v;
  const void* bias;
  void* out;
  int64_t batch, heads, seq_q, seq_kv, head_dim, head_dim_v;
  int64_t q_stride_batch, q_stride_seq, q_stride_head;
  int64_t k_stride_batch, k_stride_seq, k_stride_head;
  int64_t v_stride_batch, v_stride_seq, v_stride_head;
  int64_t out_stride_batch, out_stride_seq, out_stride_head;
  int64_t bias_stride_batch, bias_stride_head, bias_stride_query;
  int64_t bias_kv_capacity;
  float scale;
  int32_t causal;
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

// The device current at the first call and its SM count, cached so that later calls
// (e.g. under CUDA graph capture) do no device query: what CUTLASS 3.x's persistent
// tile schedulers size their grid from. An inline function's static: one per library.
struct CoDeviceInfo {
  int device;
  int sm_count;
};

inline const CoDeviceInfo& co_device_info() {
  static const CoDeviceInfo info = [] {
    CoDeviceInfo d{0, 0};
    if (cudaGetDevice(&d.device) != cudaSuccess) {
      d.device = 0;
      (void)cudaGetLastError();
    }
    if (cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, d.device) != cudaSuccess) {
      d.sm_count = 0;          // CUTLASS queries the device itself when it sees 0
      (void)cudaGetLastError();
    }
    return d;
  }();
  return info;
}

// ``co_device_info`` as a cutlass::KernelHardwareInfo (a template: this header
// includes no CUTLASS header).
template <class HardwareInfo>
inline HardwareInfo co_hardware_info() {
  HardwareInfo hw;
  hw.device_id = co_device_info().device;
  hw.sm_count = co_device_info().sm_count;
  return hw;
}

// Raise ``kernel``'s dynamic shared memory limit to ``bytes`` on the current device,
// once per device (CUTLASS's device adapters call cudaFuncSetAttribute in every
// initialize(): host time on every launch). ``done`` is the kernel's own array of
// kCoMaxDevices flags. ``major``: the compute capability major the code needs
// (0: any). CO_CANNOT_IMPLEMENT when the device cannot run it.
constexpr int kCoMaxDevices = 64;

template <class Kernel>
inline int co_opt_in_smem(Kernel* kernel, int bytes, std::atomic<int>* done, int major = 0) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return CO_INIT_FAILED;
  }
  if (device < kCoMaxDevices && done[device].load(std::memory_order_acquire)) {
    return CO_OK;
  }
  int optin = 0, cc_major = 0;
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return CO_INIT_FAILED;
  }
  if ((major != 0 && cc_major != major) || optin < bytes) {
    return CO_CANNOT_IMPLEMENT;
  }
  if (bytes > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return CO_INIT_FAILED;
  }
  if (device < kCoMaxDevices) {
    done[device].store(1, std::memory_order_release);
  }
  return CO_OK;
}

// The bytes of an argument struct that say everything about a call: the whole struct
// but its tail padding (CoGemmArgs ends in five int32 fields: 4 bytes of padding that
// a caller need not initialize). The other structs have no padding (asserted).
constexpr size_t co_key_bytes(const CoGemmArgs*) { return offsetof(CoGemmArgs, pdl) + sizeof(int32_t); }
constexpr size_t co_key_bytes(const CoConvArgs*) { return sizeof(CoConvArgs); }
constexpr size_t co_key_bytes(const CoAttentionArgs*) { return sizeof(CoAttentionArgs); }
static_assert(sizeof(CoConvArgs) == 22 * 8, "CoConvArgs has no padding");
static_assert(sizeof(CoAttentionArgs) == 5 * 8 + 22 * 8 + 4 + 4 + 8 + 8, "CoAttentionArgs has no padding");

// The kernel Params of a launcher's last few calls, keyed by the call's argument
// bytes (pointers, sizes, strides, launch knobs). An eager model's steady state
// repeats its calls with the same tensors (PyTorch's caching allocator hands the
// same blocks back), and a hit skips the argument checks, can_implement, the
// workspace query and the TMA descriptor encodes: the host side of a call is then
// the launch alone. Only Params that depend on nothing but the arguments and the
// device info fixed at the first call (co_device_info) may be stored, and only by a
// launcher with no workspace to initialize per call. kEntries slots, replaced round
// robin (a kernel shared by many layers sees each layer's call); one mutex per
// launcher, so concurrent callers are safe.
template <class Args, class Params, int kEntries = 16>
class CoParamsCache {
  static_assert(std::is_trivially_copyable<Params>::value,
                "kernel Params are copied as bytes, as a launch does");
  static constexpr size_t kKeyBytes = co_key_bytes(static_cast<const Args*>(nullptr));

 public:
  // The Params stored for ``args``, if any
  std::optional<Params> find(const Args& args) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < used_; ++i) {
      if (std::memcmp(keys_[i], &args, kKeyBytes) == 0) {
        Params p;
        std::memcpy(static_cast<void*>(&p), params_[i], sizeof(Params));
        return p;
      }
    }
    return std::nullopt;
  }

  void put(const Args& args, const Params& params) {
    std::lock_guard<std::mutex> lock(mu_);
    int i = used_ < kEntries ? used_++ : next_;
    next_ = (i + 1) % kEntries;
    std::memcpy(keys_[i], &args, kKeyBytes);
    std::memcpy(params_[i], static_cast<const void*>(&params), sizeof(Params));
  }

 private:
  std::mutex mu_;
  int used_ = 0, next_ = 0;
  unsigned char keys_[kEntries][kKeyBytes];
  alignas(Params) unsigned char params_[kEntries][sizeof(Params)];
};
