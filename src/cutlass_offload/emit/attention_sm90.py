"""Emit CUTLASS's Hopper (sm_90a) fused multi-head attention forward kernel.

The kernel is ``FmhaKernelTmaWarpSpecialized`` of the nvidia-cutlass wheel's
``examples/88_hopper_fmha`` (built by ``kernel/fmha_kernel_builder.hpp``
``FmhaBuilder<..., KernelTmaWarpSpecializedCooperative>``: TMA loads of Q, K, V,
two consumer warpgroups of 64 queries each running QK^T and PV on wgmma with an
online softmax in registers, a TMA store of O; the FlashAttention-3 design). It is
included from the wheel, never copied (``extra_include_dirs()`` of
emit/attention.py: the examples folder).

What the example supports, read from its code (CUTLASS 4.2):

* dtypes: f16 / bf16 (fp8 needs V transposed; not used), fp32 accumulation of both
  GEMMs. f32 inputs stay on the sm80 kernel.
* One head dim for Q, K and V: the problem shape is (B, H, Q, K, D)
  (``fmha_kernel_tma_warpspecialized.hpp`` ProblemShape); head_dim != head_dim_v
  stays on the sm80 kernel.
* Head dims: ``can_implement`` (fmha_collective_tma_warpspecialized.hpp) needs D <=
  the tile's head extent and D % 8 == 0 (16-byte TMA rows), and seq_q % 8 == 0.
  The last one is not needed and not checked here: Q is read by TMA (rows past
  seq_q are zero-filled), O's TMA store clips them and the log-sum-exp store is
  predicated on seq_q (fmha_epilogue.hpp), so Whisper's 1500 queries run in place.
  A D below the tile's head extent is zero-filled by the TMA loads (the dot
  products are unchanged) and clipped by the TMA store of O, so the UNet's head
  dims 40 / 80 / 160 run on the 64 / 128 / 256 tiles with no copy (the comment in
  ResidualFusion::before_softmax says the same). Configs (families/attention_sm90.py
  CONFIGS): BlockQ 128 (or 192 for head tiles up to 64) x BlockKV 64 or 128 x head tile (the example's 32 / 64 /
  128 / 256, and 48 / 80 / 96 / 160, exact fits of common head dims), K/V
  pipeline depth 5 (the kStagesKV default; 4 where 5 do not fit), cooperative or
  ping-pong (persistent, Q on its own pipeline: the builder's mapping).
* Scale: ``to_underlying_arguments`` hard-codes 1/sqrt(D) into
  ``Params::scale_softmax`` / ``scale_softmax_log2``; the softmax reads only those
  two fields (fmha_collective_softmax.hpp: exp2(scale_log2 * s - scale_log2 *
  max), LSE = max * scale + log(sum)), so ``run`` overwrites both with the
  region's scale after building the Params. The row max is taken on the unscaled
  logits, so only scale > 0 is right (a negative scale runs on -Q, as for the
  sm80 kernel; ``AttentionRegion.negate``).
* Masks: ``Fusion`` is a template parameter. ``DefaultFusion`` masks nothing, not
  even the keys past seq_kv in the last K/V tile (TMA fills them with 0: logit 0,
  a wrong softmax), so the unmasked kernel uses ``ResidualFusion`` (the last tile
  masks keys >= seq_kv). ``CausalFusion`` masks key > query from the top left
  and nothing else: right for seq_q <= seq_kv (no query sees a key past seq_kv);
  bottom-right causal is the same mask only when seq_q == seq_kv. No additive
  bias (those problems stay on the sm80 kernel). A sliding window of W keys
  (``kernel.window``, compiled in) runs the causal fusion's tiles, each masked
  (also keys j <= i - W: ``WindowFusion``); the tiles wholly left of the window are
  still visited (the collectives start at key tile 0), so it does the causal
  kernel's work.
* Layout (strides): Q, K, V and O are (seq, head dim, (batch, head)) with
  ``cute::tuple<int, _1, cute::tuple<int, int>>`` strides: any 32-bit sequence,
  batch and head stride, head dim contiguous, so BSNH and BNSH both pass in place,
  and O is written with its own strides. TMA needs the pointers 16-byte aligned
  and every stride of an extent > 1 a multiple of 16 bytes (8 elements); cute
  asserts that on the host, so ``run`` checks it first. A stride-0 mode (one K/V
  head shared by every query head, a batch broadcast) is dropped from the TMA
  descriptor (cute copy_traits_sm90_tma.hpp: "size-1 or stride-0, then don't
  append"), which is what the example's README describes for MQA. Grouped-query
  attention (``kernel.kv_group`` = G query heads per K/V head, compiled in) runs the
  builder's mainloop instantiated with a head mode (G, H / G) of strides (sh, G * sh)
  for Q and (_0, sh_kv) for K / V under ``co_fmha::GqaMainloop``
  (templates/fmha_gqa_mainloop.h), which hands it the problem with that head mode:
  K and V are read in place, query head h from K/V head h / G.
* The epilogue always writes the per-row log-sum-exp (fp32, (B, H, Q) with
  strides (H*Q, Q), unpredicated on the pointer): it goes to the region's
  workspace (``workspace_size`` = batch * heads * seq_q * 4 bytes), reused across
  calls (runtime/region.py), never a per-call cudaMalloc.
* Launch: grid (ceil(seq_q / BlockQ), batch, heads) (IndividualTileScheduler) for
  the cooperative kernel, one CTA per SM for the persistent ping-pong one, 128
  threads per consumer warpgroup (BlockQ / 64 of them, the kNumMmaWarpGroups
  option) plus the producer's, ``Kernel::SharedStorageSize`` bytes of dynamic
  shared memory (raised once per device).
* Tile order: both of the example's schedulers take the query tile fastest. Under
  a causal mask query tile m reads m + 1 key tiles, and the persistent scheduler,
  striding by the grid, gives an SM the same m on every turn when the SM count is a
  multiple of the query tiles (132 SMs, 4 tiles of a 512-token prefill: the busiest
  SM reads 16 key tiles, the mean is 9.7). Configs with ``tile_scheduler == "lpt"``
  (causal only) run the builder's collectives under ``co_fmha``'s schedulers
  (templates/fmha_lpt_scheduler.h): (batch, head) fastest and the query tiles from
  the last down, heaviest first (FlashAttention-3's order for causal attention); the
  one-CTA-per-tile one launches grid (batch * heads, query tiles).
"""
from __future__ import annotations

import struct
from pathlib import Path
from string import Template

from ..families.attention_sm90 import (  # noqa: F401 - the choice re-exported
    BLOCK_Q, CONFIGS, FAMILY, PINGPONG, SCHEDULE, STAGES, choose, config_for, head_tile, legal_for,
    refusal, supports, workspace_bytes)
from ..dtypes import CPP
from ..ir import AttentionKernelSm90, KernelSource
from . import sm90_parts, staged

INCLUDES = ("atomic", "cmath", "climits", "cutlass/device_kernel.h",
            "88_hopper_fmha/collective/fmha_fusion.hpp",
            "88_hopper_fmha/kernel/fmha_kernel_builder.hpp")

# The softmax (fmha_collective_softmax.hpp) calls ::exp2f once per logit. Without
# flushing denormals, ptxas wraps each MUFU.EX2 in a range check and two predicated
# FMULs (FSETP.GEU x, -126; @!P FMUL x, 0.5; MUFU.EX2; @!P FMUL y, y): four
# instructions where -ftz=true leaves one, and the exponentials bound short head
# dims (a query-key pair at head dim 40, zero-filled to the 64 tile, costs 4 x 64 wgmma
# FLOPs against one MUFU op; FlashAttention-3 compiles with --use_fast_math for this).
# The UNet's head-dim-40 kernel (192x128x64, nvdisasm): 3024 -> 2408 instructions, the
# 198 FSETP.GEU gone; on an H100 170.5 -> 160.7 us at 4096 tokens, every Hopper corpus
# problem 0-6% faster (session 42, results/attention_ftz_staged_o_2026-12-06_h100_s42.*).
# Only denormal fp32 values change: a probability below 2^-126 becomes 0 (its share of
# a row sum >= 1 is below 1e-38; fp16's smallest subnormal is 6e-8). FTZ False
# compiles as before (A/B runs).
FTZ = True
NVCC_FLAGS = ("-ftz=true",)


def check(kernel: AttentionKernelSm90) -> None:
    """Raise ValueError unless ``kernel`` is an instantiation this module emits
    (TypeError if it is not an AttentionKernelSm90)."""
    if not isinstance(kernel, AttentionKernelSm90):
        raise TypeError(f"not a Hopper attention kernel: {kernel!r}")
    if kernel.config not in CONFIGS:
        raise ValueError(f"Hopper attention configs are families/attention_sm90.CONFIGS "
                         f"({len(CONFIGS)}: BlockQ x BlockKV x head, stages, schedule); "
                         f"got {kernel.config}")
    if not legal_for(kernel.config, kernel.causal):
        raise ValueError("the lpt tile order is for causal kernels (without a mask every "
                         "query tile does the same work)")


_KERNEL = """\
// ${name}: fused multi-head attention forward, CUTLASS examples/88_hopper_fmha
// ${semantics}
namespace ${name} {

using Element = ${element};
using TileShape = cute::Shape<cute::_${block_q}, cute::_${block_kv}, cute::_${head}>;
// (seq, head dim, (batch, head)): runtime 32-bit strides, head dim contiguous
using StrideQKVO = cute::tuple<int, cute::_1, cute::tuple<int, int>>;
${gqa_types}using StrideLSE = cute::tuple<cute::_1, cute::tuple<int, int>>;
${fusion_def}${kernel_type}using ProblemShape = typename Kernel::ProblemShape;   // (B, H, Q, K, D)

constexpr bool kCausal = ${causal};
${softcap_consts}// the LPT one-CTA-per-tile grid: ((b, h), query tiles)
constexpr bool kGridBhByTiles = ${grid_bh_by_tiles};
constexpr int64_t kBlockQ = ${block_q};
constexpr int64_t kHeadTile = ${head};
constexpr int64_t kAlign = 16 / int64_t(sizeof(Element));   // TMA: 16-byte rows and strides
constexpr int kSmemBytes = Kernel::SharedStorageSize;
constexpr int64_t kInt32Max = INT32_MAX;
constexpr int64_t kGridMax = 65535;

static bool fits32(int64_t x) { return x >= 0 && x <= kInt32Max; }
static bool ptr_aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % uintptr_t(bytes) == 0;
}
// A stride TMA accepts: non-negative, 32-bit, a multiple of 16 bytes when its extent > 1
// (size-1 modes are dropped from the descriptor).
static bool stride_ok(int64_t stride, int64_t extent) {
  return fits32(stride) && (extent <= 1 || stride % kAlign == 0);
}
static bool operand_ok(const void* p, int64_t sb, int64_t ss, int64_t sh,
                       const CoAttentionArgs& a, int64_t seq) {
  return p != nullptr && ptr_aligned(p, 16) && stride_ok(sb, a.batch) && stride_ok(ss, seq) &&
         stride_ok(sh, a.heads);
}
static bool empty(const CoAttentionArgs& a) {
  return a.batch == 0 || a.heads == 0 || a.seq_q == 0;
}
static int64_t lse_bytes(const CoAttentionArgs& a) {
  return a.batch * a.heads * a.seq_q * int64_t(sizeof(float));
}

// Every restriction of the example's kernel (see emit/attention_sm90.py) but the workspace.
static bool supported(const CoAttentionArgs& a) {
  if (a.batch < 0 || a.heads < 0 || a.seq_q < 0 || a.seq_kv < 1) return false;
  if (a.batch > kGridMax || a.heads > kGridMax || !fits32(a.seq_q) || !fits32(a.seq_kv)) return false;
  if (kGridBhByTiles && (!fits32(a.batch * a.heads) || (a.seq_q + kBlockQ - 1) / kBlockQ > kGridMax))
    return false;
  if (a.head_dim != a.head_dim_v || a.head_dim < 1 || a.head_dim > kHeadTile) return false;
  if (a.head_dim % kAlign) return false;      // can_implement's seq_q % 8: not needed (docstring)
  if (!(a.scale > 0.0f) || !(a.scale < INFINITY)) return false;
${softcap_check}${gqa_check}  if (a.bias != nullptr) return false;
  if (kCausal) {
    // CausalFusion is top-left and masks nothing past seq_kv
    if (!((a.causal == 1 && a.seq_q <= a.seq_kv) || (a.causal == 2 && a.seq_q == a.seq_kv)))
      return false;
  } else if (a.causal != 0) {
    return false;
  }
  if (!operand_ok(a.q, a.q_stride_batch, a.q_stride_seq, a.q_stride_head, a, a.seq_q)) return false;
  if (!operand_ok(a.k, a.k_stride_batch, a.k_stride_seq, a.k_stride_head, a, a.seq_kv)) return false;
  if (!operand_ok(a.v, a.v_stride_batch, a.v_stride_seq, a.v_stride_head, a, a.seq_kv)) return false;
  if (!operand_ok(a.out, a.out_stride_batch, a.out_stride_seq, a.out_stride_head, a, a.seq_q))
    return false;
  // the log-sum-exp rows: (B, H, Q) with 32-bit strides and offsets
  if (!fits32(a.batch * a.heads * a.seq_q)) return false;
  return true;
}

static typename Kernel::Params make_params(const CoAttentionArgs& a) {
  using cute::_1;
  const ProblemShape problem{int(a.batch), int(a.heads), int(a.seq_q), int(a.seq_kv),
                             int(a.head_dim)};
  auto stride = [](int64_t seq, int64_t batch, int64_t head) {
    return StrideQKVO{int(seq), _1{}, cute::make_tuple(int(batch), int(head))};
  };
${gqa_strides}  cutlass::KernelHardwareInfo hw_info = co_hardware_info<cutlass::KernelHardwareInfo>();   // the persistent scheduler's grid
  typename Kernel::Arguments args{
      problem,
      {static_cast<const Element*>(a.q), ${q_stride}(a.q_stride_seq, a.q_stride_batch, a.q_stride_head),
       static_cast<const Element*>(a.k), ${kv_stride}(a.k_stride_seq, a.k_stride_batch, a.k_stride_head),
       static_cast<const Element*>(a.v), ${kv_stride}(a.v_stride_seq, a.v_stride_batch, a.v_stride_head)},
      {static_cast<Element*>(a.out), stride(a.out_stride_seq, a.out_stride_batch, a.out_stride_head),
       static_cast<float*>(a.workspace),
       StrideLSE{_1{}, cute::make_tuple(int(a.heads * a.seq_q), int(a.seq_q))}},
      hw_info};
  typename Kernel::Params p = Kernel::to_underlying_arguments(args, nullptr);
  // to_underlying_arguments hard-codes 1/sqrt(head_dim); the softmax reads only these two
  p.mainloop.scale_softmax = ${softmax_scale};
  p.mainloop.scale_softmax_log2 = float(double(${softmax_scale}) * 1.4426950408889634);  // log2(e)
  return p;
}

// Raise the kernel's dynamic shared memory limit once per device (prelude.h);
// CO_CANNOT_IMPLEMENT off sm_90 (sm_90a code).
static int prepare_smem() {
  static std::atomic<int> done[kCoMaxDevices];
  return co_opt_in_smem(cutlass::device_kernel<Kernel>, kSmemBytes, done, 9);
}

int64_t workspace_size(const CoAttentionArgs& args) {
  if (empty(args) || !supported(args)) return 0;
  return lse_bytes(args);
}

// Params of earlier calls by their argument bytes (prelude.h): a repeated call skips
// the checks and the TMA descriptor encodes
static CoParamsCache<CoAttentionArgs, typename Kernel::Params> co_params_cache;

static int launch(const typename Kernel::Params& p, cudaStream_t stream) {
  const int status = prepare_smem();
  if (status != CO_OK) return status;
  cutlass::device_kernel<Kernel>
      <<<Kernel::get_grid_shape(p), Kernel::get_block_shape(), kSmemBytes, stream>>>(p);
  if (cudaGetLastError() != cudaSuccess) return CO_LAUNCH_FAILED;
  return CO_OK;
}

int run(const CoAttentionArgs& args, cudaStream_t stream) {
  if (auto cached = co_params_cache.find(args)) return launch(*cached, stream);
  if (args.batch < 0 || args.heads < 0 || args.seq_q < 0) return CO_CANNOT_IMPLEMENT;
  if (empty(args)) return CO_OK;  // empty output: nothing to launch
  if (!supported(args)) return CO_CANNOT_IMPLEMENT;
  if (args.workspace_bytes < lse_bytes(args)) return CO_WORKSPACE_TOO_SMALL;
  if (args.workspace == nullptr || !ptr_aligned(args.workspace, 16)) return CO_CANNOT_IMPLEMENT;
  const typename Kernel::Params p = make_params(args);
  co_params_cache.put(args, p);   // the LSE workspace needs no initialization
  return launch(p, stream);
}

}  // namespace ${name}
"""


_BUILDER_KERNEL = """\
using Kernel = typename cutlass::fmha::kernel::FmhaBuilder<
    Element, float, float, TileShape, StrideQKVO, StrideQKVO, StrideQKVO,
    ${fusion}, cutlass::gemm::${schedule},
    ${options}
    >::Kernel;
"""

# The builder's mainloop and epilogue under a tile scheduler of ours
# (templates/fmha_lpt_scheduler.h); the builder maps ping-pong onto the cooperative
# kernel with the persistent options, spelled out here.
_LPT_KERNEL = """\
using Builder = cutlass::fmha::kernel::FmhaBuilder<
    Element, float, float, TileShape, StrideQKVO, StrideQKVO, StrideQKVO,
    ${fusion}, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
    ${options}>;
// query tiles heaviest first (causal: tile m reads m + 1 key tiles)
using Kernel = cutlass::fmha::kernel::FmhaKernelTmaWarpSpecialized<
    typename Builder::CollectiveMainloop, typename Builder::CollectiveEpilogue,
    co_fmha::${scheduler},
    ${options}>;
"""

LPT_SCHEDULER = (Path(__file__).parent / "templates" / "fmha_lpt_scheduler.h").read_text()

# O stored by templates/fmha_staged_epilogue.h instead of the example's TMA epilogue
# (FmhaFwdEpilogue): about 15 of the kernel's 22 s of template instantiation in nvcc
# (session 38). On since session 42: correct on an H100 (tests/gpu/test_attention_sm90.py,
# both stores) and within 1% or faster on every corpus problem (benchmarks/kernels_bench.py
# --kinds attention, fp16, with -ftz=true: 0.97-1.01x the TMA store's time on the long
# problems, 0.89-0.95x on the short head-dim-160 ones;
# benchmarks/results/attention_ftz_staged_o_2026-12-06_h100_s42.*). False: the example's
# epilogue (A/B runs); $CUTLASS_OFFLOAD_STAGED_EPILOGUE does not change it.
STAGED_EPILOGUE: bool = True


def staged_o() -> bool:
    """Whether O is stored by the staged epilogue (``STAGED_EPILOGUE``)."""
    return STAGED_EPILOGUE


STAGED_EPILOGUE_H = (Path(__file__).parent / "templates" / "fmha_staged_epilogue.h").read_text()
GQA_MAINLOOP_H = (Path(__file__).parent / "templates" / "fmha_gqa_mainloop.h").read_text()

_STAGED_KERNEL = """\
using Builder = cutlass::fmha::kernel::FmhaBuilder<
    Element, float, float, TileShape, StrideQKVO, StrideQKVO, StrideQKVO,
    ${fusion}, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
    ${options}>;
// the builder's mainloop and scheduler; O staged in shared memory (fmha_staged_epilogue.h)
using Kernel = cutlass::fmha::kernel::FmhaKernelTmaWarpSpecialized<
    typename Builder::CollectiveMainloop,
    co_fmha::StagedFwdEpilogue<Element, float, typename Builder::CollectiveMainloop::TileShapePV>,
    ${scheduler},
    ${options}>;
"""


# Grouped-query attention: the builder's mainloop with the grouped strides, regrouped by
# co_fmha::GqaMainloop (templates/fmha_gqa_mainloop.h), under the scheduler and epilogue
# the other kernels of this config use.
_GQA_KERNEL = """\
using Builder = cutlass::fmha::kernel::FmhaBuilder<
    Element, float, float, TileShape, StrideQ, StrideKV, StrideKV,
    ${fusion}, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
    ${options}>;
// query head h reads K/V head h / kKvGroup in place (fmha_gqa_mainloop.h)
using Kernel = cutlass::fmha::kernel::FmhaKernelTmaWarpSpecialized<
    co_fmha::GqaMainloop<typename Builder::CollectiveMainloop, kKvGroup>,
    ${epilogue},
    ${scheduler},
    ${options}>;
"""

# the head modes of the grouped strides: Q (sh, G * sh), K / V (_0, sh_kv)
_GQA_TYPES = """\
// grouped-query attention: G query heads per K/V head; head mode (G, H / G)
constexpr int kKvGroup = ${group};
using StrideQ = cute::tuple<int, cute::_1, cute::tuple<int, cute::tuple<int, int>>>;
using StrideKV = cute::tuple<int, cute::_1, cute::tuple<int, cute::tuple<cute::_0, int>>>;
"""

_GQA_STRIDES = """\
  auto q_stride = [](int64_t seq, int64_t batch, int64_t head) {
    return StrideQ{int(seq), _1{}, cute::make_tuple(int(batch),
                                                    cute::make_tuple(int(head), int(head * kKvGroup)))};
  };
  auto kv_stride = [](int64_t seq, int64_t batch, int64_t head) {   // head: per K/V head
    return StrideKV{int(seq), _1{}, cute::make_tuple(int(batch), cute::make_tuple(cute::_0{}, int(head)))};
  };
"""


def _kernel_type(kernel: AttentionKernelSm90, fusion: str) -> str:
    """The C++ ``using Kernel = ...;`` of ``kernel``: the example's builder, or for the
    "lpt" tile scheduler the builder's collectives under co_fmha's schedulers."""
    opt = "cutlass::fmha::kernel::Option<cutlass::fmha::kernel::Tag::{}, {}>"
    options = [opt.format("kStagesKV", f"cute::Int<{kernel.config.stages}>")]
    if kernel.config.tile[0] != BLOCK_Q:     # 64 queries per consumer warpgroup
        options.append(opt.format("kNumMmaWarpGroups", f"cute::Int<{kernel.config.tile[0] // 64}>"))
    schedule = kernel.config.kernel_schedule
    lpt = kernel.config.tile_scheduler == "lpt"
    staged_store = staged_o()
    if not lpt and not staged_store and kernel.kv_group == 1:
        return Template(_BUILDER_KERNEL).substitute(fusion=fusion, schedule=schedule,
                                                    options=",\n    ".join(options))
    persistent = schedule == PINGPONG
    if persistent:   # what FmhaBuilder<..., Pingpong> appends (fmha_kernel_builder.hpp)
        options += [opt.format("kIsPersistent", "cute::true_type"),
                    opt.format("kLoadsQSeparately", "cute::true_type")]
    scheduler = "LptPersistentTileScheduler" if persistent else "LptIndividualTileScheduler"
    if kernel.kv_group > 1:
        epilogue = ("co_fmha::StagedFwdEpilogue<Element, float, "
                    "typename Builder::CollectiveMainloop::TileShapePV>" if staged_store
                    else "typename Builder::CollectiveEpilogue")
        return Template(_GQA_KERNEL).substitute(
            fusion=fusion, options=",\n    ".join(options), epilogue=epilogue,
            scheduler=f"co_fmha::{scheduler}" if lpt else "typename Builder::TileScheduler")
    if staged_store:
        return Template(_STAGED_KERNEL).substitute(
            fusion=fusion, options=",\n    ".join(options),
            scheduler=f"co_fmha::{scheduler}" if lpt else "typename Builder::TileScheduler")
    return Template(_LPT_KERNEL).substitute(fusion=fusion, scheduler=scheduler,
                                            options=",\n    ".join(options))


# A tanh soft-cap on the logits (Gemma 2): the collective calls the fusion's
# before_softmax only on the K/V tiles it counts as masked (fmha_collective_softmax.hpp
# step<false> skips it), so every tile is one here; the mask of the base fusion comes
# after the cap, as the model adds its mask to the capped logits. tanh.approx.f32
# (cutlass::fast_tanh, one MUFU op; FlashAttention's soft-cap uses the same).
# Every K/V tile the base fusion visits counted as masked, so before_softmax sees each
# (the soft-cap and the window fusions' trip counts)
_EVERY_TILE_MASKED = """\
  template<class BlkCoord, class TileShape, class ProblemSize>
  CUTLASS_DEVICE int get_masked_trip_count(BlkCoord const& blk_coord, TileShape const& tile_shape,
                                           ProblemSize const& problem_size) {
    return Base::get_trip_count(blk_coord, tile_shape, problem_size);
  }

  template<class BlkCoord, class TileShape, class ProblemSize>
  CUTLASS_DEVICE int get_unmasked_trip_count(BlkCoord const&, TileShape const&, ProblemSize const&) {
    return 0;
  }

"""

_SOFTCAP_FUSION = """\
struct SoftcapFusion : ${base} {
  using Base = ${base};
  static constexpr float kCap = ${cap};
  static constexpr float kInner = ${inner};   // scale / cap

""" + _EVERY_TILE_MASKED + """  template<class AccQK, class IndexQK, class ProblemSize>
  CUTLASS_DEVICE void before_softmax(AccQK& acc_qk, IndexQK const& index_qk,
                                     ProblemSize const& problem_size) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(acc_qk); i++) {
      acc_qk(i) = kCap * cutlass::fast_tanh(acc_qk(i) * kInner);
    }
    Base::before_softmax(acc_qk, index_qk, problem_size);
  }
};
"""


# A top-left sliding window (transformers' sliding_window: Mistral, Gemma 2 / 3): query i
# sees keys i - W < j <= i. Every tile the causal fusion visits is masked (the collective
# calls before_softmax only on the tiles it counts as masked); the window's left edge
# after the causal mask. Each row keeps its diagonal key, and a row's leading tiles
# wholly left of its window leave its max at -inf, which the collective's softmax
# treats as 0 (fmha_collective_softmax.hpp), so the row's sum only starts later.
_WINDOW_FUSION = """\
struct WindowFusion : cutlass::fmha::collective::CausalFusion {
  using Base = cutlass::fmha::collective::CausalFusion;
  static constexpr int kWindow = ${window};

""" + _EVERY_TILE_MASKED + """  template<class AccQK, class IndexQK, class ProblemSize>
  CUTLASS_DEVICE void before_softmax(AccQK& acc_qk, IndexQK const& index_qk,
                                     ProblemSize const& problem_size) {
    Base::before_softmax(acc_qk, index_qk, problem_size);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(acc_qk); i++) {
      auto pos = index_qk(i);
      if (cute::get<1>(pos) <= cute::get<0>(pos) - kWindow) {
        acc_qk(i) = -INFINITY;
      }
    }
  }
};
"""


def _float(x: float) -> str:
    """A C++ float literal of ``x`` rounded to float32, exactly."""
    return f"{struct.unpack('>f', struct.pack('>f', x))[0]!r}f"


def values(kernel: AttentionKernelSm90) -> dict:
    """The substitution dict of ``kernel``'s C++ (raises ValueError via ``check``)."""
    check(kernel)
    q, kv, d = kernel.config.tile
    gqa = kernel.kv_group > 1
    mask = "top-left causal" if kernel.causal else "no mask"
    base = "cutlass::fmha::collective::" + ("CausalFusion" if kernel.causal else "ResidualFusion")
    fusion, fusion_def = base, ""
    if kernel.window:
        base = fusion = "WindowFusion"
        fusion_def = Template(_WINDOW_FUSION).substitute(window=kernel.window)
        mask = f"top-left causal within a sliding window of {kernel.window} keys"
    if kernel.softcap:
        fusion = "SoftcapFusion"
        # the product is formed in double and rounded once, as the reference's scale / cap
        fusion_def += Template(_SOFTCAP_FUSION).substitute(
            base=base, cap=_float(kernel.softcap), inner=_float(kernel.scale / kernel.softcap))
        mask = f"logits soft-capped at {kernel.softcap:g} (scale {kernel.scale:g}), {mask}"
    if gqa:
        mask += f"; query head h reads K/V head h / {kernel.kv_group}"
    return {
        "name": kernel.name,
        "semantics": (f"out = softmax(scale * q k^T, {mask}) v; {kernel.dtype}, head dims "
                      f"multiples of 8 up to {d} (TMA zero-fills the rest), LSE in the workspace"),
        "element": CPP[kernel.dtype],
        "block_q": q, "block_kv": kv, "head": d,
        "kernel_type": _kernel_type(kernel, fusion),
        "fusion_def": fusion_def,
        "causal": "true" if kernel.causal else "false",
        # empty without a soft-cap: those kernels' source is what it was before it existed
        # (their build cache entries stay valid)
        "softcap_consts": (f"// soft-capped logits: the fusion applies the scale, the softmax none\n"
                           f"constexpr float kCompiledScale = {_float(kernel.scale)};\n"
                           if kernel.softcap else ""),
        "softcap_check": ("  if (a.scale != kCompiledScale) return false;   // the fusion holds it\n"
                          if kernel.softcap else ""),
        "softmax_scale": "1.0f" if kernel.softcap else "a.scale",
        # empty for one K/V head per query head: that source is what it was before
        "gqa_types": Template(_GQA_TYPES).substitute(group=kernel.kv_group) if gqa else "",
        "gqa_check": ("  if (a.heads % kKvGroup) return false;   // whole K/V head groups\n"
                      if gqa else ""),
        "gqa_strides": _GQA_STRIDES if gqa else "",
        "q_stride": "q_stride" if gqa else "stride",
        "kv_stride": "kv_stride" if gqa else "stride",
        "grid_bh_by_tiles": ("true" if kernel.config.tile_scheduler == "lpt"
                             and kernel.config.kernel_schedule != PINGPONG else "false"),
    }


def emit(kernel: AttentionKernelSm90) -> KernelSource:
    """Return the KernelSource of one Hopper attention kernel.

    ``code`` defines ``namespace <kernel.name> { int64_t workspace_size(const
    CoAttentionArgs&); int run(const CoAttentionArgs&, cudaStream_t); }`` over the
    same C ABI as emit/attention.py; ``run`` checks every restriction (module
    docstring) and returns a CoStatus: CO_CANNOT_IMPLEMENT for an unsupported call
    (or a device that is not sm_90), CO_WORKSPACE_TOO_SMALL, or CO_INIT_FAILED /
    CO_LAUNCH_FAILED from CUDA. Compiles for sm_90a only. Raises ValueError for
    an illegal kernel (see ``check``)."""
    # the staged epilogue's headers go after the includes, with the code (their guards
    # keep one copy per unit)
    code = ((staged.COMMON_H + STAGED_EPILOGUE_H if staged_o() else "")
            + (GQA_MAINLOOP_H if kernel.kv_group > 1 else "")
            + Template(_KERNEL).substitute(values(kernel)))
    return KernelSource(name=kernel.name, includes=INCLUDES, code=code,
                        args_type="CoAttentionArgs", nvcc_flags=NVCC_FLAGS if FTZ else (),
                        preamble=(sm90_parts.TMA_DRIVER,) + (
                            (LPT_SCHEDULER,) if kernel.config.tile_scheduler == "lpt" else ()))
