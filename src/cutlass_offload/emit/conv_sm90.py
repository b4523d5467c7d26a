"""C++ for one CUTLASS 3.x sm90a implicit-GEMM conv2d fprop (family ``cutlass3x_sm90``).

``emit(kernel)`` returns a ``KernelSource`` whose code defines, inside
``namespace <kernel.name>``::

    int64_t workspace_size(const CoConvArgs& args);        // bytes (always 0 today)
    int run(const CoConvArgs& args, cudaStream_t stream);  // a CoStatus

The kernel: the conv mainloop builder (``cutlass::conv::collective::CollectiveBuilder``,
``conv::Operator::kFprop``: TMA im2col loads of the NHWC activation, tiled TMA
loads of the KRSC filter, wgmma), the sm90 epilogue builder with an EVT fusion
(as in gemm_sm90.py), ``ConvUniversal<ConvProblemShape<kFprop, 2>, ...>`` and
``ConvUniversalAdapter``.

How the conv maps onto the GEMM (all paths under cutlass_library/source/include):

* cutlass/conv/detail.hpp, ``get_transformed_problem_shape_MNKL``: for fprop
  M = (Q, P, N) (output pixels, W fastest), N = K (output channels),
  K = (C, S, R), L = _1. The mainloop sees M linearized (``get_linearized_...``).
  So an output channel is a GEMM *column*: the bias and the per-channel residual
  vector are ``Sm90RowBroadcast`` nodes (stride <_0, _1, _0>: constant along M),
  exactly like CUTLASS's own ``LinCombPerColBias`` used by its conv fusion tests.
* cutlass/detail/layout.hpp, ``TagToStrideC<TensorNHWC>``: the epilogue's C/D
  stride is ((q, p, n), _1, _0); for packed NPQK that is ((K, Q*K, P*Q*K), 1, 0)
  (the order follows M = (Q, P, N); see examples/76_blackwell_conv, which fills
  it from ``stride_C[RankT-2-i]``). With a TensorNHWC layout tag the epilogue
  builder picks TMA im2col store/load for D and C (sm90_builder.inl), so the
  full residual is simply the epilogue's C operand (``Sm90SrcFetch``).
* cutlass/conv/dispatch_policy.hpp: ``MainloopSm90TmaGmmaWarpSpecializedImplicitGemm``
  static_asserts that the Cooperative / Pingpong conv schedules are "not supported
  for conv yet" (CUTLASS 4.2). The only sm90 schedule is
  ``KernelImplicitTmaWarpSpecializedSm90``, which derives from
  ``gemm::KernelTmaWarpSpecialized`` (sm90_implicit_gemm_tma_warpspecialized.hpp:
  ConvUniversal *is* that GemmUniversal): non-persistent, one producer and one
  consumer warpgroup, so the epilogue schedule is ``TmaWarpSpecialized`` and the
  whole accumulator tile lives in 128 threads' registers.
* cutlass_library/conv3x_emitter.py: the tile's K mode is wrapped in a Shape
  (``Shape<_M, _N, Shape<_K>>``) so that the mainloop tiles the C sub-mode of
  K = (C, S, R) and iterates S and R (C below the tile is zero-filled by TMA).
* cutlass/conv/convnd_problem_shape.hpp: ``ConvProblemShape`` carries lower AND
  upper padding and computes P = 1 + (H + lower + upper - ((R-1)*dil + 1)) / stride.
  run() passes lower = (pad_h, pad_w) and the upper padding that reproduces the
  caller's P and Q: (P-1)*stride + dil*(R-1) + 1 - H - pad (asymmetric padding
  is native). A negative value (the last input rows are never read, e.g. a 1x1
  stride-2 conv on an even H) is clamped to 0: the mainloop's can_implement
  refuses negative padding, and any upper padding in (-stride, 0] gives the same
  P (the im2col traversal extent is (H + upper_corner - lower_corner - 1) / stride
  + 1, copy_traits_sm90_im2col.hpp). run() then checks that CUTLASS's P, Q equal
  the caller's.
* TMA im2col limits: families/conv_sm90.py (``supports``).

The epilogue ``y = post(residual_op(activation(acc + bias), residual))`` is an
EVT computed in fp32, built as in gemm_sm90.py (same functors); a plain
epilogue is ``LinearCombination`` with beta 0 and no source load.

``run`` does no allocation, no synchronisation and no device query (the
non-persistent kernel's grid comes from the problem shape alone), so it can be
captured into a CUDA graph. It builds the TMA descriptors on the host each call.
"""
from __future__ import annotations

import string

from ..families.conv_sm90 import (  # noqa: F401 - the family's rules, re-exported
    _MAX_ACC_PER_THREAD, CANDIDATES, EPILOGUE_SCHEDULE, FAMILY, KERNEL_SCHEDULE, make_config,
    supports)
from ..ir import ConvKernel, GemmEpilogue, KernelSource
from . import activations, sm90_parts, staged
from .evt_sm90 import ELEMENT, PER_SAMPLE_PREAMBLE, per_sample_broadcast, row_broadcast, semantics, src_fetch

INCLUDES = (
    "cute/tensor.hpp",
    "cutlass/cutlass.h",
    "cutlass/numeric_types.h",
    "cutlass/epilogue/thread/activation.h",
    "cutlass/epilogue/fusion/operations.hpp",
    "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp",
    "cutlass/epilogue/collective/collective_builder.hpp",
    "cutlass/conv/convnd_problem_shape.hpp",
    "cutlass/conv/dispatch_policy.hpp",
    "cutlass/conv/collective/collective_builder.hpp",
    "cutlass/conv/kernel/conv_universal.hpp",
    "cutlass/conv/device/conv_universal_adapter.hpp",
)

# The adapter's run (non-persistent: no PDL)
_LAUNCH = """\
  if (Conv::run(params, stream) != cutlass::Status::kSuccess) {
"""

# The parts every sm90 emitter shares are spliced in (sm90_parts.py). Placeholders
# are ${name}; substitution is strict (KeyError on a missing key).
TEMPLATE = string.Template("""\
// ${name}
// y = ${semantics}
namespace ${name} {

using ElementA = ${element};   // x, NHWC
using ElementB = ${element};   // filter, KRSC
using ElementC = ${element_c};   // residual source (void: none)
using ElementD = ${element};   // y, NPQK
using ElementBias = ${element};
using ElementAccumulator = float;
using ElementCompute = float;
// KRSC is the filter's "NHWC" (K outermost, C innermost): the builder wants
// the same tag for activation and filter (gmem_layout_tags_to_spatial_dims).
using LayoutA = cutlass::layout::TensorNHWC;
using LayoutB = cutlass::layout::TensorNHWC;
using LayoutC = cutlass::layout::TensorNHWC;
using LayoutD = cutlass::layout::TensorNHWC;
""" + sm90_parts.ALIGNMENTS + """// K mode wrapped in a Shape: tiles C within K = (C, S, R)
using TileShape = cute::Shape<cute::_${tile_m}, cute::_${tile_n}, cute::Shape<cute::_${tile_k}>>;
""" + sm90_parts.EPILOGUE + """using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    cutlass::conv::Operator::kFprop,
    ElementA, LayoutA, AlignmentA,
    ElementB, LayoutB, AlignmentB,
    ElementAccumulator,
    TileShape, ClusterShape,
    ${stage_count},
    cutlass::conv::${kernel_schedule}
  >::CollectiveOp;

using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, 2>;

using ConvKernel = cutlass::conv::kernel::ConvUniversal<
    ProblemShape,
    CollectiveMainloop,
    CollectiveEpilogue>;

using Conv = cutlass::conv::device::ConvUniversalAdapter<ConvKernel>;

using StrideOut = cute::Stride<cute::Stride<int64_t, int64_t, int64_t>, cute::_1, cute::_0>;
static_assert(CollectiveMainloop::NumSpatialDimensions == 2, "conv2d");
static_assert(cute::is_same_v<typename ConvKernel::StrideD, StrideOut>,
              "D: modes ((q, p, n), k, batch) of NPQK");
static_assert(cute::is_same_v<typename ConvKernel::StrideC, StrideOut>,
              "C: modes ((q, p, n), k, batch) of NPQK");

static inline bool co_fits_int(int64_t v) { return v >= 0 && v <= INT32_MAX; }
static inline bool co_tma_aligned(const void* p) {
  return p != nullptr && (reinterpret_cast<uintptr_t>(p) & 15u) == 0;  // TMA: 16-byte bases
}

// Checks CUTLASS's can_implement does not make (see conv_sm90.py).
static inline bool co_args_ok(const CoConvArgs& a) {
""" + sm90_parts.CONV_EXTENTS_OK + """  if (a.dilation_h < 1 || a.dilation_w < 1) return false;
  // TMA im2col elementStrides are in [1, 8]; a failed descriptor encode would go unnoticed
  if (a.stride_h < 1 || a.stride_w < 1 || a.stride_h > 8 || a.stride_w > 8) return false;
  int64_t m = a.n * a.p;  // GEMM M = N*P*Q, each factor < 2^31: no overflow
  if (m > INT32_MAX) return false;
  return m * a.q <= INT32_MAX;
}

// Bottom (right) padding that makes the output extent `out`; a negative value
// (trailing input never read) is clamped to 0, which keeps the extent because it
// lies in (-stride, 0]; run() re-checks the extents anyway.
static inline int co_upper_pad(int64_t out, int64_t in, int64_t filter, int64_t lower,
                               int64_t stride, int64_t dilation) {
  int64_t upper = (out - 1) * stride + dilation * (filter - 1) + 1 - in - lower;
  // too large stays too large (can_implement refuses > 256) instead of wrapping
  return static_cast<int>(upper < 0 ? 0 : (upper > INT32_MAX ? INT32_MAX : upper));
}

static inline ProblemShape make_problem(const CoConvArgs& a) {
  return ProblemShape(
      cutlass::conv::Mode::kCrossCorrelation,
      {int(a.n), int(a.h), int(a.w), int(a.c)},  // activation NHWC, packed
      {int(a.k), int(a.r), int(a.s), int(a.c)},  // filter KRSC, packed
      {int(a.pad_h), int(a.pad_w)},              // lower (top, left) padding
      {co_upper_pad(a.p, a.h, a.r, a.pad_h, a.stride_h, a.dilation_h),
       co_upper_pad(a.q, a.w, a.s, a.pad_w, a.stride_w, a.dilation_w)},  // upper
      {int(a.stride_h), int(a.stride_w)},
      {int(a.dilation_h), int(a.dilation_w)},
      1);                                        // groups
}

static inline typename Conv::Arguments make_arguments(const CoConvArgs& args,
                                                      const ProblemShape& problem) {
  // packed NPQK seen as the epilogue's ((q, p, n), k, batch)
  StrideOut stride_out = cute::make_stride(
      cute::make_stride(int64_t(args.k), int64_t(args.q * args.k),
                        int64_t(args.p * args.q * args.k)),
      cute::_1{}, cute::_0{});
  typename Conv::Arguments arguments{
      problem,
      {static_cast<ElementA const*>(args.x), static_cast<ElementB const*>(args.filter)},
      {{},
       ${ptr_c},
       stride_out,
       static_cast<ElementD*>(args.y),
       stride_out}};
${fusion_args}
  return arguments;
}

int64_t workspace_size(const CoConvArgs& args) {
  if (!co_args_ok(args) || args.n == 0) {
    return 0;
  }
  return static_cast<int64_t>(Conv::get_workspace_size(make_arguments(args, make_problem(args))));
}

""" + sm90_parts.launcher("ConvKernel", "CoConvArgs", _LAUNCH) + """int run(const CoConvArgs& args, cudaStream_t stream) {
""" + sm90_parts.CACHE_HIT + """  if (!co_args_ok(args)) {
    return CO_CANNOT_IMPLEMENT;
  }
  if (args.n == 0) {
    return CO_OK;  // empty output: nothing to launch
  }
  if (!(co_tma_aligned(args.x) && co_tma_aligned(args.filter) && co_tma_aligned(args.y)${operand_check})) {
    return CO_CANNOT_IMPLEMENT;
  }
  ProblemShape problem = make_problem(args);
  // CUTLASS derives P, Q from the padding; they must be the caller's
  if (problem.shape_C[1] != args.p || problem.shape_C[2] != args.q) {
    return CO_CANNOT_IMPLEMENT;
  }
  typename Conv::Arguments arguments = make_arguments(args, problem);
  if (Conv::can_implement(arguments) != cutlass::Status::kSuccess) {
    return CO_CANNOT_IMPLEMENT;
  }
""" + sm90_parts.run_tail("Conv", "ConvKernel"))


# The staged elementwise epilogue (staged.py) in place of the TMA epilogue: the NPQK
# output's rows are at a constant distance (k), so its 16-byte row chunks are the
# GEMM's; only while staged.form() is one, for the kernels staged_epilogue_applies accepts.
STAGED_TEMPLATE = string.Template(TEMPLATE.template.replace(sm90_parts.EPILOGUE, staged.EPILOGUE.template))


def staged_epilogue_applies(kernel: ConvKernel) -> bool:
    """Whether ``kernel`` takes the staged epilogue (staged.applies: an elementwise
    epilogue, a full NPQK residual if any; only while staged.form() is one) and its tile
    N is one wgmma's (sm90_parts.BASE_WGMMA_N): the conv builder picks its atom from
    CuTe's default widths, so a 160-wide tile runs five 32-wide wgmmas (MMA_N = 5), which
    the staged epilogues do not read (session 39: sd-unet's 128x160 convs failed their
    layout check; they keep the TMA epilogue)."""
    return kernel.config.tile[1] in sm90_parts.BASE_WGMMA_N and staged.applies(kernel.dtype, kernel.epilogue)


def _reads_source(ep: GemmEpilogue) -> bool:
    """True when the full NPQK residual is the epilogue's C operand."""
    return ep.residual != "none" and not ep.residual_broadcast


def _residual_source(ep: GemmEpilogue):
    if ep.residual_per_sample:
        return per_sample_broadcast("args.residual", "args.p * args.q", "args.k")
    return row_broadcast("args.residual") if ep.residual_broadcast else src_fetch()


def _residual_text(ep: GemmEpilogue) -> str:
    return ("residual[n, k]" if ep.residual_per_sample else
            "residual[k]" if ep.residual_broadcast else "residual")


def validate(kernel: ConvKernel) -> None:
    """Check that ``kernel`` is a buildable cutlass3x_sm90 conv2d fprop kernel.

    Returns None. Raises ValueError for a wrong family/arch, a 2.x iterator or
    unity-stride variant, a dtype other than f16/bf16, non-f32 accumulation, an
    alignment below 8 elements (TMA needs 16 bytes), or a tile, cluster, stage
    count or schedule the sm90 conv builders reject (or that would spill: more
    than 128 accumulators per thread).
    """
    cfg = kernel.config
    if cfg.family != FAMILY:
        raise ValueError(f"conv_sm90 emits family {FAMILY!r}, got {cfg.family!r}")
    if kernel.arch != "sm90a":
        raise ValueError(f"{FAMILY} needs arch 'sm90a', got {kernel.arch!r}")
    if kernel.iterator:
        raise ValueError(f"3.x conv kernels use TMA im2col; iterator must be '', "
                         f"got {kernel.iterator!r}")
    if kernel.stride_support != "strided":
        raise ValueError("3.x conv kernels take any stride at run time; "
                         "stride_support must be 'strided'")
    if kernel.dtype not in ("f16", "bf16"):
        raise ValueError(f"{FAMILY} conv supports f16 and bf16, got {kernel.dtype!r}")
    if kernel.accumulate != "f32":
        raise ValueError(f"only f32 accumulation is supported, got {kernel.accumulate!r}")
    need = 128 // ELEMENT[kernel.dtype][1]
    for what, a in (("align_a", kernel.align_a), ("align_b", kernel.align_b),
                    ("align_c", kernel.align_c)):
        if a != need:
            raise ValueError(f"{what}={a}: TMA needs 16-byte alignment, i.e. {need} "
                             f"{kernel.dtype} elements (C and K multiples of {need})")
    tm, tn, tk = cfg.tile
    if cfg.n_split:
        raise ValueError("N-split warp groups are for GEMM kernels (gemm_sm90), not implicit-GEMM convs")
    if tm not in (64, 128):
        # one consumer warpgroup: 64-row wgmma atoms, M tile 64 or 128
        raise ValueError(f"tile M must be 64 or 128, got {tm}")
    if not (tn % 16 == 0 and 16 <= tn <= 256):
        raise ValueError(f"tile N must be a multiple of 16 in [16, 256], got {tn}")
    if tm * tn // 128 > _MAX_ACC_PER_THREAD:
        raise ValueError(f"tile {tm}x{tn} needs {tm * tn // 128} fp32 accumulators per thread "
                         f"in the single consumer warpgroup (at most {_MAX_ACC_PER_THREAD})")
    if tk not in (16, 32, 64, 128):
        # one wgmma K step is 16; the TMA im2col box holds at most 256 channels
        raise ValueError(f"tile K must be 16, 32, 64 or 128, got {tk}")
    cm, cn, ck = cfg.cluster
    if ck != 1 or cm not in (1, 2, 4) or cn not in (1, 2, 4) or cm * cn > 4:
        raise ValueError(f"cluster must be (1|2|4, 1|2|4, 1) with at most 4 CTAs, "
                         f"got {cfg.cluster}")
    if cfg.kernel_schedule != KERNEL_SCHEDULE:
        raise ValueError(f"kernel_schedule must be {KERNEL_SCHEDULE!r} (CUTLASS 4.2 has no "
                         f"cooperative or ping-pong sm90 conv), got {cfg.kernel_schedule!r}")
    if cfg.epilogue_schedule not in ("", EPILOGUE_SCHEDULE):
        raise ValueError(f"epilogue_schedule must be {EPILOGUE_SCHEDULE!r} (or ''), "
                         f"got {cfg.epilogue_schedule!r}")
    sm90_parts.check_stages(cfg.stages)


def values(kernel: ConvKernel) -> dict:
    """The substitution dict (str -> str) for ``TEMPLATE`` or ``STAGED_TEMPLATE`` (the
    ``${staged_*}`` values are the second's only): the conv's element, tile and
    cluster, its EVT (a per-channel residual as a row broadcast) or the staged
    epilogue's arguments, and the residual source. Raises what ``validate`` raises."""
    validate(kernel)
    cfg = kernel.config
    ep = kernel.epilogue
    element = ELEMENT[kernel.dtype][0]

    # A (K,) residual is one value per output channel, like the bias; an (N, K) one
    # one per sample and channel: row m of the implicit GEMM is in sample m / (P*Q)
    if staged_epilogue_applies(kernel):
        fusion_type, fusion_args = "", staged.fusion_args(ep)
    else:
        fusion_type, fusion_args = sm90_parts.fusion(ep, _residual_source(ep))
    stage_count = sm90_parts.stage_count(cfg.stages, "conv")

    # every pointer the kernel reads must be there and TMA/vector aligned
    operand_check = ""
    if ep.bias:
        operand_check += " && co_tma_aligned(args.bias)"
    if ep.residual != "none":
        operand_check += " && co_tma_aligned(args.residual)"

    return {
        "name": kernel.name,
        "semantics": semantics(ep, "conv(x, filter)", "bias[k]", _residual_text(ep)),
        "epilogue_tag": ep.tag,
        "element": element,
        "element_c": element if _reads_source(ep) else "void",
        **sm90_parts.shape_values(kernel),   # alignments, tile, cluster
        "fusion_type": fusion_type,
        "fusion_args": fusion_args,
        "epilogue_schedule": EPILOGUE_SCHEDULE,
        "kernel_schedule": cfg.kernel_schedule,
        "stage_count": stage_count,
        "ptr_c": ("static_cast<ElementC const*>(args.residual)" if _reads_source(ep)
                  else "nullptr"),
        "operand_check": operand_check,
        **(staged.values(ep, staged.CONV_STRIDE, kernel.config.tile[1])
           if staged_epilogue_applies(kernel) else {}),
    }


def emit(kernel: ConvKernel) -> KernelSource:
    """Return the ``KernelSource`` for one cutlass3x_sm90 conv2d fprop kernel.

    The code defines ``namespace <kernel.name> { int64_t workspace_size(const
    CoConvArgs&); int run(const CoConvArgs&, cudaStream_t); }`` and expects
    prelude.h and ``includes`` to come first in the TU.

    Raises ValueError for a kernel this family cannot build (see ``validate``),
    KeyError if the template and ``values`` ever disagree on a placeholder.
    """
    staged_ep = staged_epilogue_applies(kernel)
    code = ((staged.HEADERS + STAGED_TEMPLATE.substitute(values(kernel))) if staged_ep
            else TEMPLATE.substitute(values(kernel)))
    includes = INCLUDES + (staged.INCLUDES if staged_ep else ())
    per_sample = (PER_SAMPLE_PREAMBLE,) if kernel.epilogue.residual_per_sample else ()
    return KernelSource(name=kernel.name, includes=includes, code=code, args_type="CoConvArgs",
                        preamble=(sm90_parts.TMA_DRIVER,) + per_sample
                        + activations.preamble(kernel.epilogue.activation))
