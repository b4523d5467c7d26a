"""C++ for one CUTLASS 3.x sm90a TMA warp-specialized GEMM (family ``cutlass3x_sm90``).

``emit(kernel)`` returns a ``KernelSource`` whose code defines, inside
``namespace <kernel.name>``::

    int64_t workspace_size(const CoGemmArgs& args);        // bytes
    int run(const CoGemmArgs& args, cudaStream_t stream);  // a CoStatus

The kernel is built with the CUTLASS collective builders (mainloop and epilogue),
``GemmUniversal<Shape<int,int,int,int>, ...>`` (problem (M, N, K, L)), launched as
``GemmUniversalAdapter`` launches it (templates/sm90_kernel_adapter.h, without that
header's every-architecture includes); the tile scheduler is CUTLASS's default persistent one
or, for ``config.tile_scheduler == "stream_k"``, ``cutlass::gemm::StreamKScheduler``
(partial tiles are reduced through the workspace, which ``initialize`` zeroes on
the stream, so it stays graph-capturable). The scheduler's run-time arguments come
from the args' launch knobs (ir.GemmLaunch, prelude.h): raster order and swizzle
for both schedulers, splits and decomposition (data-parallel, split-K, stream-K or
CUTLASS's heuristic) for stream-K; ``pdl`` launches with programmatic dependent
launch (persistent kernels only: they are compiled with grid dependency control,
``GDC_DEFINES``). Knob values a kernel cannot take are refused
(CO_CANNOT_IMPLEMENT). The epilogue
``D = post(residual_op(activation(acc + bias), C))`` is an epilogue visitor tree
(EVT) computed in fp32; a plain epilogue uses ``LinearCombination`` with beta 0
and no source load (ElementC = void).

A ``config.swap_ab`` kernel computes the transpose, D^T (N, M) = B^T A^T: CUTLASS's A
is the problem's B (an (N, K) weight, K contiguous), its B the problem's A, its D
(and C) column-major, which is the problem's D row-major; the bias runs along D^T's
rows. The arguments stay the problem's (CoGemmArgs), swapped in ``make_arguments``.

``run`` does no allocation, no synchronisation and, after its first call, no
device query, so it can be captured into a CUDA graph.
"""
from __future__ import annotations

import string
from pathlib import Path

from ..ir import GemmKernel, KernelSource
from . import activations, glu_sm90, sm90_parts, staged
from .evt_sm90 import ELEMENT, semantics

FAMILY = "cutlass3x_sm90"

_KERNEL_SCHEDULES = (
    "KernelTmaWarpSpecializedCooperative",
    "KernelTmaWarpSpecializedPingpong",
    "KernelTmaWarpSpecialized",
)
# kernel schedule -> the epilogue schedule it must be paired with
_EPILOGUE_FOR = {
    "KernelTmaWarpSpecializedCooperative": "TmaWarpSpecializedCooperative",
    "KernelTmaWarpSpecializedPingpong": "TmaWarpSpecialized",
    "KernelTmaWarpSpecialized": "TmaWarpSpecialized",
}

# Headers of every kernel of the family: CUTLASS's sm90 pieces one by one, not its
# umbrella headers (gemm/collective/collective_builder.hpp includes every collective
# and builder of sm70-sm120, gemm/device/gemm_universal_adapter.h every GEMM kernel and
# the 2.x device layer), whose parse cudafe++, cicc and the host compiler each repeat
# per unit; the adapter is templates/sm90_kernel_adapter.h. On 2 cores a one-kernel
# unit took 12.1 s against 15.5 s (staged epilogue) and 23.1 against 25.5 s (TMA
# epilogue), with the same PTX (benchmarks/unit_headers.py;
# benchmarks/results/unit_headers_2core_2026-12-05_s40.txt).
INCLUDES = (
    "cute/tensor.hpp",
    "cutlass/cutlass.h",
    "cutlass/numeric_types.h",
    "cutlass/kernel_hardware_info.h",
    "cutlass/kernel_launch.h",
    "cutlass/cluster_launch.hpp",
    "cutlass/epilogue/thread/activation.h",
    "cutlass/gemm/dispatch_policy.hpp",
    "cutlass/gemm/collective/collective_mma_decl.hpp",
    "cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized.hpp",
    "cutlass/gemm/collective/collective_builder_decl.hpp",
    "cutlass/gemm/collective/builders/sm90_gmma_builder.inl",
    "cutlass/gemm/kernel/gemm_universal_decl.h",
)
# the kernel's GemmUniversal specialization, by kernel schedule. The non-persistent
# kernel's header uses IsCutlass3ArrayKernel, which only the umbrella defines, so that
# schedule (which no selector or table picks) keeps it.
KERNEL_HEADER = {
    "KernelTmaWarpSpecializedCooperative": "cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_cooperative.hpp",
    "KernelTmaWarpSpecializedPingpong": "cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_pingpong.hpp",
    "KernelTmaWarpSpecialized": "cutlass/gemm/kernel/gemm_universal.hpp",
}
# CUTLASS's TMA epilogue: its collective builder and fusion callbacks (the EVT)
TMA_EPILOGUE_INCLUDES = (
    "cutlass/epilogue/fusion/operations.hpp",
    "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp",
    "cutlass/epilogue/collective/collective_builder.hpp",
)
KERNEL_ADAPTER_H = (Path(__file__).parent / "templates" / "sm90_kernel_adapter.h").read_text()

# The adapter's run, with PDL when the args ask for it (GDC compiled in: GDC_DEFINES)
_LAUNCH = """\
  // PDL: the kernel's griddepcontrol.wait (CUTLASS_ENABLE_GDC_FOR_SM90) holds its first
  // global read until the previous kernel on the stream is done
  if (Gemm::run(params, stream, nullptr, args.pdl != 0) != cutlass::Status::kSuccess) {
"""

_MAINLOOP = """\
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    ElementA, LayoutA, AlignmentA,
    ElementB, LayoutB, AlignmentB,
    ElementAccumulator,
    TileShape, ClusterShape,
    ${stage_count},
    cutlass::gemm::${kernel_schedule}
  >::CollectiveOp;${mma_check}
"""

# One template for the family, with the parts every sm90 emitter shares spliced in
# (sm90_parts.py). Placeholders are ${name}; substitution is strict
# (string.Template.substitute raises KeyError on a missing key).
_TEXT = ("""\
// ${name}
// D = ${semantics}
namespace ${name} {

using ElementA = ${element_ab};
using ElementB = ${element_ab};
using ElementC = ${element_c};
using ElementD = ${element_d};
using ElementBias = ${element_d};
using ElementAccumulator = float;
using ElementCompute = float;
using LayoutA = ${layout_a};
using LayoutB = ${layout_b};
using LayoutC = ${layout_cd};
using LayoutD = ${layout_cd};
""" + sm90_parts.ALIGNMENTS + """using TileShape = cute::Shape<cute::_${tile_m}, cute::_${tile_n}, cute::_${tile_k}>;
""" + sm90_parts.EPILOGUE + _MAINLOOP + """
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
    cute::Shape<int, int, int, int>,  // (M, N, K, L)
    CollectiveMainloop,
    CollectiveEpilogue${tile_scheduler}>;

using Gemm = co_sm90::KernelAdapter<GemmKernel>;   // templates/sm90_kernel_adapter.h

static_assert(cute::is_same_v<typename GemmKernel::StrideA, ${stride_a_type}>,
              "A: ${layout_a_doc}");
static_assert(cute::is_same_v<typename GemmKernel::StrideB, ${stride_b_type}>,
              "B: ${layout_b_doc}");
static_assert(cute::is_same_v<typename GemmKernel::StrideD, ${stride_d_type}>,
              "D: ${layout_d_doc}");

static inline typename Gemm::Arguments make_arguments(const CoGemmArgs& args) {
  typename Gemm::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {static_cast<int>(args.${extent_m}), static_cast<int>(args.${extent_n}), static_cast<int>(args.k),
       static_cast<int>(args.l)},
      {static_cast<ElementA const*>(args.${operand_a}),
       ${stride_a_value},
       static_cast<ElementB const*>(args.${operand_b}),
       ${stride_b_value}},
      {{},
       ${ptr_c},
       ${stride_c_value},
       static_cast<ElementD*>(args.d),
       ${stride_d_value}},
      co_hardware_info<cutlass::KernelHardwareInfo>()};
${fusion_args}
  // launch knobs (prelude.h): how the tile scheduler walks the output tiles
  arguments.scheduler.max_swizzle_size = args.swizzle > 0 ? args.swizzle : 1;
  arguments.scheduler.raster_order =
      static_cast<cutlass::gemm::kernel::detail::RasterOrderOptions>(args.raster_order);
${scheduler_args}${cluster_occupancy}
  return arguments;
}

// Knob values this kernel can take (prelude.h): anything else is refused, not clamped
static inline bool co_knobs_ok(const CoGemmArgs& args) {
  bool swizzle = args.swizzle == 0 || args.swizzle == 1 || args.swizzle == 2 ||
                 args.swizzle == 4 || args.swizzle == 8;
  bool split = ${split_knobs_ok};
#ifdef CUTLASS_ENABLE_GDC_FOR_SM90
  bool pdl = args.pdl == 0 || args.pdl == 1;
#else
  bool pdl = args.pdl == 0;   // no griddepcontrol.wait compiled in: a PDL launch could race
#endif
  return swizzle && split && pdl && args.raster_order >= 0 && args.raster_order <= 2;
}

static inline bool co_fits_int(int64_t v) { return v >= 0 && v <= INT32_MAX; }
static inline bool co_tma_aligned(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;  // TMA needs 16-byte aligned bases
}

int64_t workspace_size(const CoGemmArgs& args) {
  return static_cast<int64_t>(Gemm::get_workspace_size(make_arguments(args)));
}

""" + sm90_parts.launcher("GemmKernel", "CoGemmArgs", _LAUNCH) + """int run(const CoGemmArgs& args, cudaStream_t stream) {
""" + sm90_parts.CACHE_HIT + """  if (!(co_fits_int(args.m) && co_fits_int(args.n) && co_fits_int(args.k) && co_fits_int(args.l))) {
    return CO_CANNOT_IMPLEMENT;
  }
  if (args.m == 0 || args.n == 0 || args.l == 0) {
    return CO_OK;  // empty output: nothing to launch
  }
  if (!(co_tma_aligned(args.a) && co_tma_aligned(args.b) && co_tma_aligned(args.d)${c_check}) ||
      !co_knobs_ok(args)) {
    return CO_CANNOT_IMPLEMENT;
  }
  typename Gemm::Arguments arguments = make_arguments(args);
  if (Gemm::can_implement(arguments) != cutlass::Status::kSuccess) {
    return CO_CANNOT_IMPLEMENT;
  }
""" + sm90_parts.run_tail("Gemm", "GemmKernel"))
TEMPLATE = string.Template(_TEXT)

# A clustered kernel's persistent grid from the clusters the device holds at once
# (templates/cluster_occupancy.h says why); 1x1 kernels' source stays as it was.
CLUSTER_OCCUPANCY = (Path(__file__).parent / "templates" / "cluster_occupancy.h").read_text()
_CLUSTER_OCCUPANCY = """
  static std::atomic<int> co_clusters_known[kCoMaxDevices];
  arguments.hw_info.max_active_clusters = co_max_active_clusters(
      reinterpret_cast<const void*>(cutlass::device_kernel<GemmKernel>),
      static_cast<int>(GemmKernel::SharedStorageSize), static_cast<int>(GemmKernel::MaxThreadsPerBlock),
      dim3(@CLUSTER@, 1), co_clusters_known);"""


def clustered(config) -> bool:
    """Whether ``config`` launches clusters of more than one CTA."""
    return config.cluster[0] * config.cluster[1] * config.cluster[2] > 1

# A GLU epilogue (ir.GemmEpilogue.glu): glu_sm90's in place of the collective builder's
# TMA epilogue; the rest of the kernel's text is TEMPLATE's.
GLU_TEMPLATE = string.Template(_TEXT.replace(sm90_parts.EPILOGUE, glu_sm90.EPILOGUE))

# The staged elementwise epilogue (staged.py) in place of the collective builder's
# TMA epilogue, for the kernels ``staged_epilogue_applies`` accepts while staged.ENABLED.
STAGED_TEMPLATE = string.Template(_TEXT.replace(sm90_parts.EPILOGUE, staged.EPILOGUE.template))


def staged_epilogue_applies(kernel: GemmKernel) -> bool:
    """Whether ``kernel`` takes the staged epilogue (staged.applies: 16-bit, not swap
    AB, not N-split, an elementwise epilogue; only while staged.ENABLED)."""
    return staged.applies(kernel.dtype, kernel.epilogue, kernel.config.swap_ab, kernel.config.n_split)


# N-split cooperative kernels (KernelConfig.n_split, warp = (M, N / 2, K)): the two
# consumer warp groups split the tile's columns, not its rows, so a tile may be 192
# rows high (cuBLAS's "coopB" kernels: whisper's 6000x768 outputs are 128 tiles of
# 192x192, one wave on 132 SMs, where 128-row tiles make 188). CUTLASS's builders
# only split rows and only take 128-row epilogue subtiles for cooperative kernels, so
# mainloop and epilogue are assembled here from the parts the builders use.
_N_SPLIT_EPILOGUE = """\
// Each warp group holds 64-row blocks of its half of the columns, so a subtile spans
// the tile's width (64 x ${tile_n}), with one store stage (a second would cost the
// mainloop one). Assembled as the builder's Sm90TmaBuilderImpl assembles it, but for
// the shared-memory swizzle atoms: as wide as one warp group's ${wg_n} columns, since
// an atom as wide as the subtile (64 columns for 192) would straddle the two halves.
using EpilogueTile = cute::Shape<cute::_64, cute::_${tile_n}>;
using WarpGroupTile = cute::Shape<cute::_64, cute::_${wg_n}>;
using EpiloguePolicyAuto = decltype(cutlass::epilogue::collective::detail::sm90_get_tma_dispatch_policy<
    TileShape, EpilogueTile, ElementC, ElementD, cutlass::epilogue::TmaWarpSpecializedCooperative>());
using EpiloguePolicy = cutlass::epilogue::Sm90TmaWarpSpecialized<
    EpiloguePolicyAuto::StagesC, 1, EpiloguePolicyAuto::FragmentSize,
    EpiloguePolicyAuto::ReuseSmemC, EpiloguePolicyAuto::DelayTmaStore>;
using StrideC = cutlass::detail::TagToStrideC_t<LayoutC>;
using StrideD = cutlass::detail::TagToStrideC_t<LayoutD>;
using ElementCSmem = cute::conditional_t<cute::is_void_v<ElementC>, ElementD, ElementC>;
using CollectiveEpilogue = cutlass::epilogue::collective::CollectiveEpilogue<
    EpiloguePolicy, TileShape, EpilogueTile,
    ElementC, StrideC, ElementD, StrideD,
    typename cutlass::epilogue::collective::detail::CallbacksBuilder<
        EpiloguePolicy, FusionOp, TileShape, EpilogueTile, ElementAccumulator>::Callbacks,
    cute::SM90_TMA_LOAD,
    decltype(cutlass::epilogue::collective::detail::sm90_get_epilogue_smem_swizzle_layout_atom<
        StrideC, ElementCSmem, WarpGroupTile>()),
    decltype(cutlass::epilogue::collective::detail::sm90_get_smem_load_op_for_source<
        StrideC, ElementCSmem, WarpGroupTile>()),
    cute::SM90_TMA_STORE,
    decltype(cutlass::epilogue::collective::detail::sm90_get_epilogue_smem_swizzle_layout_atom<
        StrideD, ElementD, WarpGroupTile>()),
    decltype(cutlass::epilogue::collective::detail::sm90_get_smem_store_op_for_accumulator<
        StrideD, ElementD, WarpGroupTile>()),
    cute::Copy_Atom<cute::SM90_U32x4_STSM_N, cutlass::half_t>,
    void>;

"""
_N_SPLIT_MAINLOOP = """\
// The builder's mainloop but for its TiledMma: warp groups side by side along N, each
// on 64 x ${wg_n} wgmmas over all ${tile_m} rows
constexpr auto MajorA = cutlass::gemm::collective::detail::gmma_ss_tag_to_major_A<ElementA, LayoutA>();
constexpr auto MajorB = cutlass::gemm::collective::detail::gmma_ss_tag_to_major_B<ElementB, LayoutB>();
using TiledMma = decltype(cute::make_tiled_mma(
    cute::SM90::GMMA::MMA_64x${wg_n}x16_${wgmma_kind}_SS<MajorA, MajorB>{},
    cute::Layout<cute::Shape<cute::_1, cute::_2, cute::_1>>{}));
constexpr int MainloopStages = cutlass::gemm::collective::detail::compute_stage_count_or_override<
    cutlass::gemm::collective::detail::sm90_smem_capacity_bytes, ElementA, ElementB, TileShape>(
    ${stage_count}{});
using CollectiveMainloop = cutlass::gemm::collective::CollectiveMma<
    cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<MainloopStages, ClusterShape,
                                                      cutlass::gemm::${kernel_schedule}>,
    TileShape,
    ElementA, cutlass::detail::TagToStrideA_t<LayoutA>,
    ElementB, cutlass::detail::TagToStrideB_t<LayoutB>,
    TiledMma,
    decltype(cutlass::gemm::collective::detail::sm90_cluster_shape_to_tma_atom(cute::shape<1>(ClusterShape{}))),
    decltype(cutlass::gemm::collective::detail::ss_smem_selector<
        MajorA, ElementA, decltype(cute::get<0>(TileShape{})), decltype(cute::get<2>(TileShape{}))>()),
    void, cute::identity,
    decltype(cutlass::gemm::collective::detail::sm90_cluster_shape_to_tma_atom(cute::shape<0>(ClusterShape{}))),
    decltype(cutlass::gemm::collective::detail::ss_smem_selector<
        MajorB, ElementB, decltype(cute::get<1>(TileShape{})), decltype(cute::get<2>(TileShape{}))>()),
    void, cute::identity>;
static_assert(cute::size(TiledMma{}) == 256 && MainloopStages >= 2,
              "two consumer warp groups, at least two mainloop stages");
"""
N_SPLIT_TEMPLATE = string.Template(
    _TEXT.replace(sm90_parts.EPILOGUE_BUILDER, _N_SPLIT_EPILOGUE).replace(_MAINLOOP, _N_SPLIT_MAINLOOP))


def template_for(kernel: GemmKernel) -> string.Template:
    """The family's template ``kernel`` is emitted from: GLU_TEMPLATE for a GLU
    epilogue, STAGED_TEMPLATE where the staged epilogue applies, N_SPLIT_TEMPLATE for
    an N-split config, else TEMPLATE."""
    if kernel.epilogue.glu:
        return GLU_TEMPLATE
    if staged_epilogue_applies(kernel):
        return STAGED_TEMPLATE
    return N_SPLIT_TEMPLATE if kernel.config.n_split else TEMPLATE


# CUTLASS's grid dependency control (griddepcontrol.wait before the first global read,
# cutlass/arch/grid_dependency_control.h) compiled into the persistent kernels, so a
# PDL launch is safe; without a PDL launch the instructions return at once. Not for
# stream-K kernels: CUTLASS 4.2's stream-K scheduler does not compile with it
# (sm90_tile_scheduler_stream_k.hpp is_last_tile), so they get units of their own.
GDC_DEFINES = ("CUTLASS_ENABLE_GDC_FOR_SM90",)

_STREAM_K_ARGS = """\
  arguments.scheduler.splits = args.splits > 0 ? args.splits : 1;
  arguments.scheduler.decomposition_mode =
      static_cast<cutlass::gemm::kernel::detail::DecompositionMode>(args.decomposition);"""


def validate(kernel: GemmKernel) -> None:
    """Check that ``kernel`` is a buildable cutlass3x_sm90 kernel.

    Returns None. Raises ValueError for a wrong family/arch, an alignment TMA
    cannot do (16-byte: 8 elements for 16-bit types, 4 for TF32), a tile,
    cluster or schedule combination the sm90 builders reject; raises
    NotImplementedError for TF32 with a row-major (N-contiguous) B.
    """
    cfg = kernel.config
    if cfg.family != FAMILY:
        raise ValueError(f"gemm_sm90 emits family {FAMILY!r}, got {cfg.family!r}")
    if kernel.arch != "sm90a":
        raise ValueError(f"{FAMILY} needs arch 'sm90a', got {kernel.arch!r}")
    if kernel.layout_a not in ("row", "col"):
        raise ValueError(f"layout_a must be 'row' or 'col', got {kernel.layout_a!r}")
    if kernel.dtype == "f32" and kernel.layout_a != "row":
        raise NotImplementedError(
            "TF32 on sm90 wgmma needs K-major operands; A with layout 'col' (M contiguous) "
            "is not supported")
    if kernel.accumulate != "f32":
        raise ValueError(f"only f32 accumulation is supported, got {kernel.accumulate!r}")
    if kernel.dtype == "f32" and kernel.layout_b != "col":
        raise NotImplementedError(
            "TF32 on sm90 wgmma needs K-major operands; B with layout 'row' (N contiguous) "
            "is not supported, use layout_b='col' or a 16-bit dtype")
    bits = ELEMENT[kernel.dtype][1]
    need = 128 // bits
    for what, a in (("align_a", kernel.align_a), ("align_b", kernel.align_b),
                    ("align_c", kernel.align_c)):
        if a % need:
            raise ValueError(
                f"{what}={a}: TMA needs 16-byte alignment, i.e. {need} {kernel.dtype} elements")
    tm, tn, tk = cfg.tile
    if cfg.n_split:
        _validate_n_split(kernel)
    elif tm not in (64, 128, 256):
        raise ValueError(f"tile M must be 64, 128 or 256, got {tm}")
    if not (tn % 16 == 0 and 16 <= tn <= 256):
        raise ValueError(f"tile N must be a multiple of 16 in [16, 256], got {tn}")
    k_atom = 256 // bits  # one wgmma K step: 16 for 16-bit, 8 for tf32
    if tk <= 0 or tk % k_atom:
        raise ValueError(f"tile K must be a positive multiple of {k_atom}, got {tk}")
    cm, cn, ck = cfg.cluster
    # 8 CTAs: the portable cluster size limit (CUDA programming guide, thread block clusters)
    if ck != 1 or cm not in (1, 2, 4) or cn not in (1, 2, 4) or cm * cn > 8:
        raise ValueError(f"cluster must be (1|2|4, 1|2|4, 1) with at most 8 CTAs, got {cfg.cluster}")
    if cfg.kernel_schedule not in _KERNEL_SCHEDULES:
        raise ValueError(f"kernel_schedule must be one of {_KERNEL_SCHEDULES}, "
                         f"got {cfg.kernel_schedule!r}")
    if cfg.kernel_schedule == "KernelTmaWarpSpecializedCooperative" and tm < 128:
        raise ValueError(f"the cooperative schedule needs tile M >= 128, got {tm}")
    epi = cfg.epilogue_schedule or _EPILOGUE_FOR[cfg.kernel_schedule]
    if epi != _EPILOGUE_FOR[cfg.kernel_schedule]:
        raise ValueError(f"epilogue_schedule {epi!r} does not match kernel_schedule "
                         f"{cfg.kernel_schedule!r} (expected {_EPILOGUE_FOR[cfg.kernel_schedule]!r})")
    if cfg.tile_scheduler not in ("persistent", "stream_k"):
        raise ValueError(f"GEMM tile schedulers are 'persistent' and 'stream_k', got "
                         f"{cfg.tile_scheduler!r}")
    if cfg.swap_ab and (kernel.layout_a, kernel.layout_b) != ("row", "col"):
        raise ValueError("swap_ab needs K-contiguous A and B (layout_a 'row', layout_b 'col'), "
                         f"got {kernel.layout_a!r} / {kernel.layout_b!r}")
    if cfg.swap_ab and (kernel.epilogue.glu or kernel.dtype not in ("f16", "bf16")):
        raise ValueError("swap_ab kernels are f16 / bf16 without a GLU epilogue")
    if cfg.tile_scheduler == "stream_k" and cfg.kernel_schedule != "KernelTmaWarpSpecializedCooperative":
        # sm90_gemm_tma_warpspecialized_pingpong.hpp static_asserts against stream-K
        raise ValueError("the stream-K tile scheduler needs the cooperative kernel schedule")
    sm90_parts.check_stages(cfg.stages)


def _validate_n_split(kernel: GemmKernel) -> None:
    """The limits of N-split kernels (N_SPLIT_TEMPLATE): cooperative, persistent,
    16-bit, no GLU epilogue, tile M a multiple of 64 from 128 to 256 and each warp
    group's N a multiple of 16, with at most 160 fp32 accumulators per thread (the
    consumer warp groups get 232 registers)."""
    cfg = kernel.config
    tm, tn, _ = cfg.tile
    if cfg.kernel_schedule != "KernelTmaWarpSpecializedCooperative" or cfg.tile_scheduler != "persistent":
        raise ValueError("an N-split config needs the cooperative schedule and the persistent scheduler")
    if kernel.dtype not in ("f16", "bf16") or kernel.epilogue.glu:
        raise ValueError(f"N-split kernels are f16 / bf16 without a GLU epilogue, got {kernel.dtype}"
                         + (" with GLU" if kernel.epilogue.glu else ""))
    if tm not in (128, 192, 256) or tn % 32 or tm * tn // 256 > 160:
        raise ValueError(f"an N-split tile is 128, 192 or 256 rows by a multiple of 32 columns with "
                         f"at most 160 accumulators per thread, got {tm}x{tn}")


def _k_major(x: str) -> str:
    """The CuTe stride of operand ``x`` (a, b, c or d of CoGemmArgs) with its second
    mode contiguous: K for A and B, N for C and D."""
    return f"cute::make_stride(int64_t(args.ld{x}), cute::_1{{}}, int64_t(args.batch_stride_{x}))"


def _mn_major(x: str) -> str:
    """The CuTe stride of operand ``x`` with its first mode contiguous."""
    return f"cute::make_stride(cute::_1{{}}, int64_t(args.ld{x}), int64_t(args.batch_stride_{x}))"


_K_MAJOR_TYPE = "cute::Stride<int64_t, cute::_1, int64_t>"
_MN_MAJOR_TYPE = "cute::Stride<cute::_1, int64_t, int64_t>"


def _operands(kernel: GemmKernel) -> dict:
    """The ``${layout_*}``, ``${stride_*_type}``, ``${stride_*_value}`` and
    ``${layout_*_doc}`` values of the kernel's A and B as CUTLASS sees them: the
    problem's own, or for swap_ab B^T as A (row-major: K contiguous) and A as B."""
    if kernel.config.swap_ab:
        a = ("RowMajor", _K_MAJOR_TYPE, _k_major("b"), "B^T, row-major (N, K, L): swap AB")
        b = ("ColumnMajor", _K_MAJOR_TYPE, _k_major("a"), "A as (M, K, L), K contiguous: swap AB")
    else:
        # a column-major A: (M, K), M contiguous (TMA and wgmma read 16-bit A MN-major)
        a = (("RowMajor", _K_MAJOR_TYPE, _k_major("a"), "row-major (M, K, L)")
             if kernel.layout_a == "row" else
             ("ColumnMajor", _MN_MAJOR_TYPE, _mn_major("a"), "column-major (M, K, L), M contiguous"))
        # B stored (N, K), K contiguous (a Linear weight), or (K, N), N contiguous
        b = (("ColumnMajor", _K_MAJOR_TYPE, _k_major("b"), "(N, K, L), K contiguous")
             if kernel.layout_b == "col" else
             ("RowMajor", _MN_MAJOR_TYPE, _mn_major("b"), "(K, N, L), N contiguous"))
    out = {}
    for x, (layout, stride_type, stride, doc) in (("a", a), ("b", b)):
        out.update({f"layout_{x}": f"cutlass::layout::{layout}", f"stride_{x}_type": stride_type,
                    f"stride_{x}_value": stride, f"layout_{x}_doc": doc})
    return out


def _orientation(swap: bool) -> dict:
    """The ``${extent_*}``, ``${operand_*}``, C / D layout and stride values: the
    problem's own, or for swap_ab its transpose (CUTLASS's (M, N) is the problem's
    (N, M), its A the problem's B, D^T column-major)."""
    stride_cd = _mn_major if swap else _k_major
    return {
        "layout_cd": "cutlass::layout::ColumnMajor" if swap else "cutlass::layout::RowMajor",
        "stride_d_type": _MN_MAJOR_TYPE if swap else _K_MAJOR_TYPE,
        "layout_d_doc": "D^T (N, M, L) column-major, i.e. D row-major: swap AB" if swap
                        else "row-major (M, N, L)",
        "extent_m": "n" if swap else "m",
        "extent_n": "m" if swap else "n",
        "operand_a": "b" if swap else "a",
        "operand_b": "a" if swap else "b",
        "stride_c_value": stride_cd("c"),
        "stride_d_value": stride_cd("d"),
    }


def values(kernel: GemmKernel) -> dict:
    """Build the substitution dict for ``TEMPLATE`` (every placeholder, no more).

    Returns a dict of str -> str. Raises what ``validate`` raises.
    """
    validate(kernel)
    cfg = kernel.config
    stream_k = cfg.tile_scheduler == "stream_k"
    ep = kernel.epilogue
    element = ELEMENT[kernel.dtype][0]
    residual = ep.residual != "none"
    swap = cfg.swap_ab
    if ep.glu or staged_epilogue_applies(kernel):
        fusion_type, fusion_args = "", staged.fusion_args(ep)     # the GLU's arguments are alike
    else:
        fusion_type, fusion_args = sm90_parts.fusion(ep, transposed=swap)
    stage_count = sm90_parts.stage_count(cfg.stages, "gemm")
    shape = sm90_parts.shape_values(kernel)   # alignments, tile, cluster
    if swap:
        shape.update(align_a=str(kernel.align_b), align_b=str(kernel.align_a))

    return {
        "name": kernel.name,
        "semantics": semantics(ep, "acc", "bias", "C"),
        "epilogue_tag": ep.tag,
        "element_ab": element,
        "element_c": element if residual else "void",
        "element_d": element,
        **shape,
        **_operands(kernel),
        **_orientation(swap),
        "fusion_type": fusion_type,
        "fusion_args": fusion_args,
        "epilogue_schedule": cfg.epilogue_schedule or _EPILOGUE_FOR[cfg.kernel_schedule],
        "kernel_schedule": cfg.kernel_schedule,
        "stage_count": stage_count,
        "mma_check": sm90_parts.mma_check(cfg),
        # persistent: no argument, so those kernels' source (and cache key) is unchanged
        "tile_scheduler": (",\n    cutlass::gemm::StreamKScheduler"
                           if stream_k else ""),
        "scheduler_args": _STREAM_K_ARGS if stream_k else "",
        "cluster_occupancy": (_CLUSTER_OCCUPANCY.replace("@CLUSTER@", f"{cfg.cluster[0]}, {cfg.cluster[1]}")
                              if clustered(cfg) else ""),
        "split_knobs_ok": ("args.splits >= 0 && args.splits <= 64 && "
                           "args.decomposition >= 0 && args.decomposition <= 3"
                           if stream_k else "args.splits <= 1 && args.decomposition == 0"),
        "ptr_c": "static_cast<ElementC const*>(args.c)" if residual else "nullptr",
        "c_check": " && args.c != nullptr && co_tma_aligned(args.c)" if residual else "",
        **(glu_sm90.values(kernel) if ep.glu else {"glu_epilogue": "", "glu_store": ""}),
        **staged.values(ep, staged.GEMM_STRIDE, cfg.tile[1], sm90_parts.consumer_groups(cfg)),
        "wg_n": str(cfg.tile[1] // 2),
        "wgmma_kind": sm90_parts.WGMMA_TYPES.get(kernel.dtype, ("", ""))[1],
    }


def emit(kernel: GemmKernel) -> KernelSource:
    """Return the ``KernelSource`` (name, includes, code) for one cutlass3x_sm90 kernel.

    The code defines ``namespace <kernel.name> { int64_t workspace_size(const
    CoGemmArgs&); int run(const CoGemmArgs&, cudaStream_t); }`` and expects
    prelude.h and ``includes`` to come first in the TU.

    Raises ValueError for a kernel this family cannot build (see ``validate``),
    NotImplementedError for TF32 with B row-major, KeyError if the template and
    ``values`` ever disagree on a placeholder.
    """
    code = (code_headers(kernel) + sm90_parts.wgmma_selector(kernel)
            + template_for(kernel).substitute(values(kernel)))
    return KernelSource(name=kernel.name, includes=includes(kernel), code=code, defines=defines(kernel),
                        preamble=preamble(kernel))


def preamble(kernel: GemmKernel) -> tuple:
    """The preamble blocks ``kernel``'s code needs (emit_unit puts each once ahead of
    a unit's includes): the TMA driver lookup, the cluster occupancy query of a
    clustered kernel, the epilogue's activation functors. Also for the GEMMs that
    other families wrap (conv_gemm_sm90.py)."""
    return ((sm90_parts.TMA_DRIVER,) + ((CLUSTER_OCCUPANCY,) if clustered(kernel.config) else ())
            + activations.preamble(kernel.epilogue.activation))


def code_headers(kernel: GemmKernel) -> str:
    """The template headers ``kernel``'s code needs ahead of it: the kernel adapter
    (templates/sm90_kernel_adapter.h), then a GLU's or the staged epilogue's after what
    they share (each guarded, so a unit's kernels share one copy)."""
    own = (glu_sm90.headers(kernel) if kernel.epilogue.glu else
           staged.HEADERS if staged_epilogue_applies(kernel) else "")
    return KERNEL_ADAPTER_H + own


def defines(kernel: GemmKernel) -> tuple:
    """The macros ``kernel``'s unit defines: grid dependency control for persistent
    kernels (GDC_DEFINES), none for stream-K ones."""
    return () if kernel.config.tile_scheduler == "stream_k" else GDC_DEFINES


def includes(kernel: GemmKernel) -> tuple:
    """``INCLUDES`` and the kernel schedule's header; CuTe's extended wgmma headers for a
    tile N outside its default shapes (sm90_parts.wgmma_selector); then what its
    epilogue uses: CUTLASS's TMA epilogue (TMA_EPILOGUE_INCLUDES), or a GLU's or the
    staged one's (glu_sm90.INCLUDES)."""
    own = kernel.epilogue.glu or staged_epilogue_applies(kernel)
    return (INCLUDES + (KERNEL_HEADER[kernel.config.kernel_schedule],)
            + (sm90_parts.WGMMA_EXT_INCLUDES if sm90_parts.wide_mma(kernel.config) else ())
            + (glu_sm90.INCLUDES if own else TMA_EPILOGUE_INCLUDES))
