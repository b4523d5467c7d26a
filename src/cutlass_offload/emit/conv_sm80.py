"""Emit one CUTLASS 2.x implicit-GEMM conv2d fprop kernel (``cutlass2x_sm80`` family).

The generated C++ instantiates ``cutlass::conv::device::ImplicitGemmConvolution``
over ``cutlass::conv::kernel::DefaultConv2dFprop`` (no residual),
``DefaultConv2dFpropWithBroadcast`` (residual) or, for a grouped conv,
``DefaultConv2dGroupFprop`` (no residual; its group mode and group count compiled
in, families/grouped_conv.py), NHWC activations x KRSC filters -> NPQK output,
ArchTag Sm80 (it also runs on sm_90a). The implicit GEMM is
M = N*P*Q, N_gemm = K, K_gemm = R*S*C, so the epilogue mapping is the one of
gemm_sm80.py with "column" = output channel k:

* no residual: ``LinearCombinationGeneric``, ``act(alpha * acc + C)`` with
  ScaleType::NoBetaScaling, where the source C is the (K,) bias read through a
  TensorNHWC ref whose three strides are 0 (every output pixel reads
  bias[0..K)); without a bias, ScaleType::OnlyAlphaScaling and no source at all.
* residual: ``LinearCombinationResidualBlock``,
  ``post(binary(act(alpha * acc + vector), beta * C))`` with the bias as the
  broadcast vector (ldr = 0; a null vector loads zeros,
  epilogue/threadblock/epilogue_with_broadcast.h load_broadcast_fragment_) and
  C the residual: the packed NPQK tensor, or with ``residual_broadcast`` a (K,)
  vector read through a TensorNHWC ref with all strides 0.

Zero strides are legal in every output iterator these kernels use:
``PredicatedTileIterator`` (epilogue/threadblock/predicated_tile_iterator_params.h:
every increment is a multiple of the row stride, so 0 keeps the pointer on row 0)
and ``PredicatedTileIteratorConv`` (predicated_tile_iterator_conv.h: the offset
is dot(npq coordinate, tensor strides) = 0). Which one serves C is decided by
epilogue/threadblock/default_epilogue_tensor_op.h: the optimized multistage
kernel with StrideSupport::kStrided uses the Conv iterator, everything else
(and every residual kernel, conv/kernel/default_conv2d.h
DefaultConvEpilogueWithBroadcastTensorOp) the RowMajor one with ld =
stride[0] (epilogue/threadblock/output_iterator_parameter.h).

Activation iterators (conv/kernel/default_conv2d_fprop.h has a TensorOp NHWC
specialization for each of them with a multistage mainloop and with Stages = 2,
the register-staged ImplicitGemmPipelined):

* ``optimized`` (conv2d_fprop_activation_tile_access_iterator_optimized.h):
  precomputed pointers and per-(r, s) masks; needs C % align_a == 0 and
  R, S <= 32 (can_implement).
* ``analytic`` (..._analytic.h): recomputes (n, h, w, c) per access; any C
  divisible by align_a. Exact for every C, used for odd C >= 16.
* ``few_channels`` (..._few_channels.h): walks K_gemm = R*S*C densely, one
  access = align_a channels of one filter position; needs C % align_a == 0.
  For C < 16 (C = 3, 9, ...), where the others waste most of a 32-wide K tile.
* ``fixed_channels`` (..._fixed_channels.h): one access = one whole filter
  position; needs C == align_a == align_b (can_implement of both iterators).

Stride support: ``stride_support`` maps to StrideSupport::kStrided / kUnity. For
fprop it changes only the epilogue's output iterator of the optimized multistage
kernel (see above); every activation iterator handles any stride. A "unity"
kernel's ``run`` refuses stride != 1 all the same, so the name tells the truth.

Asymmetric padding: the kernel gets pad_h/pad_w = top/left and P, Q. All four
activation iterators compute h = p*stride_h - pad_h + r*dilation_h and mask
0 <= h < H, 0 <= w < W against the real H, W (the optimized one builds its
masks the same way, from the real H and W, never from P), so reads past the
bottom/right edge are zeros for every iterator: all four are safe.

Few/fixed channels caveat (from the same sources): the activation iterator
does not mask filter positions r >= R in the last K tile (only the filter
iterator does, returning zeros), so a non-finite x value can leak into a
neighbouring output as 0 * inf = NaN; finite inputs are exact. Analytic and
optimized mask every channel c >= C on both operands and have no such leak.

Residual kernels: ``ImplicitGemmConvolutionWithFusedEpilogue``
(conv/kernel/implicit_gemm_convolution_with_fused_epilogue.h) computes the K
iteration count with the analytic formula R*S*ceil(C/tile_k) whatever the
iterator (its Params constructor does not pass the algorithm to
implicit_gemm_k_iterations, conv/conv2d_problem_size.h), which for few/fixed
channels is up to R*S times too many iterations (correct, as the filter reads
zeros there, but slow). The emitted residual kernel therefore derives from it
with a Params that recomputes the count with the kernel's iterator, exactly as
the plain ``ImplicitGemmConvolution`` does; for analytic/optimized the count is
unchanged.

Alignment and stage rules (elements):

* f16 / bf16: align in {1, 2, 4, 8}. The multistage mainloop copies with
  cp.async of 4, 8 or 16 bytes (arch/memory_sm80.h static_assert), so
  stages >= 3 needs align_a, align_b >= 2; align 1 needs stages = 2.
* f32 (TF32, instruction 16x8x8): align in {1, 2, 4}, stages >= 3 (the same
  rule as gemm_sm80: no 2-stage float mainloop is used).

``run`` checks every runtime argument (extents >= 1 and within int, tensor sizes
under 2 GiB because the iterators use 32-bit offsets, pointer alignment, the
channel divisibility, unit stride for "unity" kernels) and returns
CO_CANNOT_IMPLEMENT when one fails or CUTLASS's can_implement does. A batch of 0
returns CO_OK without a launch. No allocation; the launch goes on ``stream``.
"""
from __future__ import annotations

from string import Template

from ..families.sm80 import ITERATORS as _ITERATOR
from ..families.sm80 import choose_iterator, conv_configs  # noqa: F401 - re-exported
from ..ir import CONV_ITERATORS, ConvKernel, KernelSource
from . import activations
from .epilogue_sm80 import (ELEMENT_TYPES, EPILOGUE_PLAIN, EPILOGUE_RESIDUAL, FAMILY,
                            INCLUDE_PLAIN_EPILOGUE, INCLUDE_RESIDUAL_EPILOGUE, INCLUDES_COMMON,
                            KERNEL, TILE_TYPES, check_alignments, check_smem, check_warp_tiling, cp_async_ok,
                            epilogue_values, semantics, shape_values)

_STRIDE_SUPPORT = {"strided": "kStrided", "unity": "kUnity"}
_GROUP_MODE = {"single": "kSingleGroup"}        # ir/conv.py GROUP_MODES

_INCLUDES_PLAIN = INCLUDES_COMMON + (
    INCLUDE_PLAIN_EPILOGUE,
    "cutlass/conv/kernel/default_conv2d_fprop.h",
    "cutlass/conv/device/implicit_gemm_convolution.h",
)
_INCLUDES_GROUPED = INCLUDES_COMMON + (
    INCLUDE_PLAIN_EPILOGUE,
    "cutlass/conv/kernel/default_conv2d_group_fprop.h",
    "cutlass/conv/device/implicit_gemm_convolution.h",
)
_INCLUDES_RESIDUAL = INCLUDES_COMMON + (
    INCLUDE_RESIDUAL_EPILOGUE,
    "cutlass/conv/kernel/default_conv2d_fprop_with_broadcast.h",
    "cutlass/conv/device/implicit_gemm_convolution.h",
)

# ---------------------------------------------------------------------------
# C++ templates (string.Template, substituted strictly)
# ---------------------------------------------------------------------------

# Types and the problem size, shared by both variants.
_TYPES = ELEMENT_TYPES + """\
using Layout = cutlass::layout::TensorNHWC;  // x NHWC, filter KRSC, y / residual NPQK
""" + TILE_TYPES + """constexpr cutlass::conv::IteratorAlgorithm kIterator =
    cutlass::conv::IteratorAlgorithm::${iterator};
constexpr cutlass::conv::StrideSupport kStrideSupport =
    cutlass::conv::StrideSupport::${stride_support};
constexpr bool kUnitStrideOnly = ${unit_stride_only};
// channel groups, compiled in (1: an ordinary conv): x's C and the filter's K split
// into kGroups groups, the filter (K, R, S, C / kGroups)
constexpr int kGroups = ${groups};

// pad_h / pad_w are the top / left padding; P and Q are passed explicitly, so the
// bottom / right padding is implied (the iterators mask rows >= H, cols >= W).
static cutlass::conv::Conv2dProblemSize problem_size(const CoConvArgs& a) {
  return cutlass::conv::Conv2dProblemSize(
      int(a.n), int(a.h), int(a.w), int(a.c), int(a.k), int(a.r), int(a.s), int(a.p), int(a.q),
      int(a.pad_h), int(a.pad_w), int(a.stride_h), int(a.stride_w),
      int(a.dilation_h), int(a.dilation_w), cutlass::conv::Mode::kCrossCorrelation,
      /*split_k_slices=*/1, kGroups);
}

template <typename Element>
static cutlass::TensorRef<Element, Layout> ref(const void* p, Layout layout) {
  return cutlass::TensorRef<Element, Layout>(static_cast<Element*>(const_cast<void*>(p)), layout);
}

// All three strides 0: every output pixel reads the same (K,) vector.
[[maybe_unused]] static Layout broadcast_layout() { return Layout(typename Layout::Stride(0)); }
"""

# The default-kernel template arguments and make_arguments' head both variants share
_KERNEL_PARAMS = """<
    ElementA, Layout, ElementB, Layout, ElementOutput, Layout, ElementAccumulator,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    ThreadblockShape, WarpShape, InstructionShape, EpilogueOp, Swizzle,
    kStages, cutlass::arch::OpMultiplyAdd, kIterator, kStrideSupport,
    kAlignA, kAlignB>::Kernel"""
_ARGUMENTS_HEAD = """;
using Conv = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;

static typename Conv::Arguments make_arguments(const CoConvArgs& args) {
  cutlass::conv::Conv2dProblemSize ps = problem_size(args);
  return typename Conv::Arguments(
      ps,
      ref<ElementA>(args.x, Layout::packed(ps.activation_extent())),
      ref<ElementB>(args.filter, Layout::packed(ps.filter_extent())),
      ref<ElementOutput>("""

# A grouped conv's (DefaultConv2dGroupFprop: the group mode before the iterator)
_GROUP_KERNEL_PARAMS = """<
    ElementA, Layout, ElementB, Layout, ElementOutput, Layout, ElementAccumulator,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    ThreadblockShape, WarpShape, InstructionShape, EpilogueOp, Swizzle,
    kStages, cutlass::arch::OpMultiplyAdd, cutlass::conv::GroupMode::${group_mode},
    kIterator, kStrideSupport, kAlignA, kAlignB>::Kernel"""

# Variant 1: no residual. D = act(alpha * acc + bias); bias read as C with zero strides.
_PLAIN = EPILOGUE_PLAIN + """
using Kernel = typename cutlass::conv::kernel::${default_kernel}""" + "${kernel_params}" + _ARGUMENTS_HEAD + """${source_ptr}, broadcast_layout()),
      ref<ElementOutput>(args.y, Layout::packed(ps.output_extent())),
      typename EpilogueOp::Params(ElementCompute(1), ElementCompute(${beta})));
}
"""

# Variant 2: residual. D = post(binary(act(alpha * acc + vector), beta * C)).
_RESIDUAL = EPILOGUE_RESIDUAL + """
using FusedKernel = typename cutlass::conv::kernel::DefaultConv2dFpropWithBroadcast""" + _KERNEL_PARAMS + """;

// The fused-epilogue kernel counts K iterations as if the iterator were analytic
// (R*S*ceil(C/tile_k)); few/fixed channels need ceil(R*S*C/tile_k) resp.
// ceil(R*S/(tile_k/C)). Recompute the count with the real algorithm, as the plain
// ImplicitGemmConvolution does; everything else is inherited unchanged.
struct Kernel : FusedKernel {
  struct Params : FusedKernel::Params {
    CUTLASS_HOST_DEVICE Params() {}
    CUTLASS_HOST_DEVICE Params(typename FusedKernel::Arguments const& args, int* semaphore = nullptr)
        : FusedKernel::Params(args, semaphore) {
      this->gemm_k_iterations = cutlass::conv::implicit_gemm_k_iterations(
          cutlass::conv::Operator::kFprop, ThreadblockShape::kK, args.problem_size, kIterator);
    }
  };
}""" + _ARGUMENTS_HEAD + """args.residual, ${residual_layout}),
      ref<ElementOutput>(args.y, Layout::packed(ps.output_extent())),
      typename EpilogueOp::Params(ElementCompute(1), ElementCompute(1)),
      cutlass::conv::SplitKMode::kSerial,
      /*ptr_Vector=*/${vector_ptr}, /*ptr_Tensor=*/nullptr, /*ldr=*/0, /*ldt=*/0);
}
"""

# Launcher shared by both variants: checks, workspace, initialize, run.
_LAUNCHER = """\
static bool aligned(const void* p, int64_t elems) {
  return reinterpret_cast<uintptr_t>(p) % uintptr_t(elems * int64_t(sizeof(ElementA))) == 0;
}

static bool in_int(int64_t v, int64_t lo) { return v >= lo && v <= INT32_MAX; }

// a * b * c * d * bytes < 2^31, without overflow (each factor is <= INT32_MAX).
static bool under_2gib(int64_t a, int64_t b, int64_t c, int64_t d) {
  const int64_t kLimit = int64_t(1) << 31;
  const int64_t factors[] = {a, b, c, d};
  int64_t v = int64_t(sizeof(ElementA));
  for (int64_t f : factors) {
    v *= f;
    if (v >= kLimit) return false;
  }
  return true;
}

// Checks CUTLASS 2.x can_implement does not make (or makes only after int overflow).
static bool supported(const CoConvArgs& a) {
  const int64_t positive[] = {a.n, a.h, a.w, a.c, a.k, a.r, a.s, a.p, a.q,
                              a.stride_h, a.stride_w, a.dilation_h, a.dilation_w};
  for (int64_t v : positive)
    if (!in_int(v, 1)) return false;
  if (!in_int(a.pad_h, 0) || !in_int(a.pad_w, 0)) return false;
  if (kUnitStrideOnly && (a.stride_h != 1 || a.stride_w != 1)) return false;
  // The iterators address with 32-bit offsets.
  if (!under_2gib(a.n, a.h, a.w, a.c) || !under_2gib(a.k, a.r, a.s, a.c) ||
      !under_2gib(a.n, a.p, a.q, a.k)) return false;
  // Packed tensors: aligned base pointers plus channel counts divisible by the
  // alignment make every vector access aligned.
  if (a.c % kGroups || a.k % kGroups) return false;
  if ((a.c / kGroups) % kAlignA || (a.c / kGroups) % kAlignB || a.k % kAlignC) return false;
  if (a.x == nullptr || a.filter == nullptr || a.y == nullptr) return false;
  if (!aligned(a.x, kAlignA) || !aligned(a.filter, kAlignB) || !aligned(a.y, kAlignC)) return false;
${operand_checks}  return true;
}

int64_t workspace_size(const CoConvArgs& args) {
  if (args.n == 0 || !supported(args)) return 0;
  return int64_t(Conv::get_workspace_size(make_arguments(args)));
}

int run(const CoConvArgs& args, cudaStream_t stream) {
  if (args.n < 0) return CO_CANNOT_IMPLEMENT;
  if (args.n == 0) return CO_OK;  // empty batch: nothing to launch
  if (!supported(args)) return CO_CANNOT_IMPLEMENT;
  typename Conv::Arguments arguments = make_arguments(args);
  if (Conv::can_implement(arguments) != cutlass::Status::kSuccess) return CO_CANNOT_IMPLEMENT;
  size_t needed = Conv::get_workspace_size(arguments);
  if (args.workspace_bytes < int64_t(needed)) return CO_WORKSPACE_TOO_SMALL;
  Conv conv;
  if (conv.initialize(arguments, needed ? args.workspace : nullptr, stream) != cutlass::Status::kSuccess)
    return CO_INIT_FAILED;
  // run() checks cudaGetLastError after the launch.
  if (conv.run(stream) != cutlass::Status::kSuccess) return CO_LAUNCH_FAILED;
  return CO_OK;
}
"""

_CHECK_BIAS = """\
  if (a.bias == nullptr || !aligned(a.bias, kAlignC)) return false;
"""
_CHECK_RESIDUAL = """\
  if (a.residual == nullptr || !aligned(a.residual, kAlignC)) return false;
"""

# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def _check_stages(kernel: ConvKernel) -> None:
    stages = kernel.config.stages
    if kernel.dtype == "f32":
        if stages < 3:
            raise ValueError("TF32 conv kernels need stages >= 3 (no 2-stage float mainloop "
                             "is used; see gemm_sm80)")
    elif stages < 2:
        raise ValueError(f"stages must be >= 2, got {stages}")
    elif not cp_async_ok(kernel.dtype, kernel.align_a, kernel.align_b) and stages != 2:
        raise ValueError(
            f"{kernel.dtype} with align_a={kernel.align_a}, align_b={kernel.align_b} needs "
            f"stages=2 (ImplicitGemmPipelined): cp.async copies only 4, 8 or 16 bytes, "
            f"got stages={stages}")


def _check_iterator(kernel: ConvKernel) -> None:
    if kernel.iterator not in _ITERATOR:
        raise ValueError(f"iterator must be one of {CONV_ITERATORS}, got {kernel.iterator!r}")
    if kernel.stride_support not in _STRIDE_SUPPORT:
        raise ValueError(f"stride_support must be 'strided' or 'unity', "
                         f"got {kernel.stride_support!r}")
    if kernel.iterator == "fixed_channels" and kernel.align_a != kernel.align_b:
        raise ValueError("fixed_channels needs align_a == align_b (both iterators require "
                         "C == their access width)")


def _check_tiles(kernel: ConvKernel) -> None:
    cfg = kernel.config
    check_warp_tiling(cfg, kernel.dtype)
    tk = cfg.tile[2]
    if tk % kernel.align_a or tk % kernel.align_b:
        raise ValueError(f"tile K {tk} must be a multiple of the operand alignments")
    check_smem(cfg, kernel.dtype)


def check(kernel: ConvKernel) -> None:
    """Raise ValueError unless ``kernel`` is a legal cutlass2x_sm80 conv2d fprop kernel.

    Checks family, accumulation, dtype/alignment/stages, iterator and stride
    support (see the module docstring), instruction shape, tile/warp divisibility
    and the mainloop shared-memory budget of sm_80.
    """
    if not isinstance(kernel, ConvKernel):
        raise ValueError(f"conv_sm80 emits ConvKernel objects, got {type(kernel).__name__}")
    if kernel.config.family != FAMILY:
        raise ValueError(f"conv_sm80 emits only {FAMILY} kernels, "
                         f"got family {kernel.config.family!r}")
    if kernel.accumulate != "f32":
        raise ValueError(f"only f32 accumulation is supported, got {kernel.accumulate!r}")
    check_alignments(kernel.dtype, align_a=kernel.align_a, align_b=kernel.align_b,
                     align_c=kernel.align_c)
    if kernel.epilogue.residual_per_sample:
        raise ValueError("a per-sample (N, K) residual is read by the sm90a TMA conv only (the 2.x "
                         "residual iterators take one row stride)")
    if kernel.groups != 1 and kernel.epilogue.residual != "none":
        raise ValueError("a grouped conv kernel has no residual epilogue (CUTLASS has no "
                         "grouped variant of the fused-epilogue conv)")
    _check_stages(kernel)
    _check_iterator(kernel)
    _check_tiles(kernel)


# ---------------------------------------------------------------------------
# Substitution values and emission
# ---------------------------------------------------------------------------

def values(kernel: ConvKernel) -> dict:
    """The substitution dict of ``kernel``'s template (both variants' keys: the
    activation iterator, stride support, the residual's layout, the epilogue).
    Raises ValueError (from ``check``) for an illegal instantiation."""
    check(kernel)
    ep = kernel.epilogue
    operand_checks = ((_CHECK_BIAS if ep.bias else "")
                      + (_CHECK_RESIDUAL if ep.residual != "none" else ""))
    source = "residual[k]" if ep.residual_broadcast else "residual"
    return {
        "name": kernel.name,
        "semantics": semantics(ep, "conv(x, w)", source),
        **shape_values(kernel),
        "iterator": _ITERATOR[kernel.iterator],
        "stride_support": _STRIDE_SUPPORT[kernel.stride_support],
        "unit_stride_only": "true" if kernel.stride_support == "unity" else "false",
        **epilogue_values(ep),
        "residual_layout": ("broadcast_layout()" if ep.residual_broadcast
                            else "Layout::packed(ps.output_extent())"),
        "operand_checks": operand_checks,
        "groups": str(kernel.groups),
        "default_kernel": "DefaultConv2dGroupFprop" if kernel.groups != 1 else "DefaultConv2dFprop",
        "kernel_params": (Template(_GROUP_KERNEL_PARAMS).substitute(group_mode=_GROUP_MODE[kernel.group_mode])
                          if kernel.groups != 1 else _KERNEL_PARAMS),
    }


def emit(kernel: ConvKernel) -> KernelSource:
    """Return the KernelSource (name, includes, code) of one cutlass2x_sm80 conv kernel.

    ``code`` defines ``namespace <kernel.name> { int64_t workspace_size(const
    CoConvArgs&); int run(const CoConvArgs&, cudaStream_t); }``; ``run`` returns
    a CoStatus. Raises ValueError for an illegal kernel (see ``check``).
    """
    v = values(kernel)
    residual = kernel.epilogue.residual != "none"
    code = Template(KERNEL).substitute(
        v,
        types=Template(_TYPES).substitute(v),
        operation=Template(_RESIDUAL if residual else _PLAIN).substitute(v),
        launcher=Template(_LAUNCHER).substitute(v),
    )
    includes = (_INCLUDES_RESIDUAL if residual else
                _INCLUDES_GROUPED if kernel.groups != 1 else _INCLUDES_PLAIN)
    return KernelSource(name=kernel.name, includes=includes, code=code, args_type="CoConvArgs",
                        preamble=activations.preamble(kernel.epilogue.activation))


legal_configs = conv_configs     # families/sm80.py (select reads it from there)
