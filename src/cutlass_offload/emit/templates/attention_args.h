// cutlass_offload C ABI: arguments of one fused multi-head attention forward call.
// (To be moved into prelude.h; the guard lets both copies coexist meanwhile.)
#pragma once
#ifndef CO_ATTENTION_ARGS
#define CO_ATTENTION_ARGS
#include <cstdint>

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
#endif  // CO_ATTENTION_ARGS
