"""Emit one CUTLASS 2.x tensor-core GEMM (``cutlass2x_sm80`` family).

The generated C++ instantiates ``cutlass::gemm::device::GemmUniversal`` with a
``LinearCombinationGeneric`` epilogue, or, when the epilogue has a residual,
``GemmUniversalWithBroadcast`` with ``LinearCombinationResidualBlock`` (the
approach of Apache TVM's CUTLASS BYOC). ArchTag is Sm80; the same code compiles
for sm_80 and sm_90a (on Hopper it serves problems whose alignment TMA cannot
handle).

Epilogue mapping, D = post(residual_op(activation(acc + bias), C)):

* no residual: ``act(alpha * acc + C)`` with ScaleType::NoBetaScaling, where the
  source C is the bias vector read with ldc = 0 and batch stride 0 (the classic
  row-broadcast trick); without a bias, ScaleType::OnlyAlphaScaling, so no
  source is read at all.
* residual: ``post(binary(act(alpha * acc + vector), beta * C))`` with the bias
  as the broadcast vector (ldr = 0, batch stride 0) and alpha = beta = 1. A null
  vector pointer is safe: CUTLASS's EpilogueWithBroadcast loads zeros when the
  pointer is null and the kernel only offsets it when it is non-null, so a
  kernel without a bias passes ``nullptr``.

Alignment rules (elements):

* f16 / bf16: align_a, align_b, align_c in {1, 2, 4, 8}. The multistage
  (cp.async) mainloop copies 4, 8 or 16 bytes, so stages >= 3 needs
  align_a, align_b >= 2; with an operand alignment of 1 the config must use
  stages = 2, which selects the register-staged MmaPipelined mainloop.
* f32 (TF32, instruction 16x8x8): align_a, align_b, align_c in {1, 2, 4}
  (4 bytes is the smallest cp.async), stages >= 3. Stages = 2 is refused: the
  2-stage DefaultMma specialization for float operands silently switches to
  OpMultiplyAddFastF16 (operands rounded to fp16), which is not TF32.

The launcher ``run`` also checks, per call, that pointers, leading dimensions
and batch strides honour the kernel's alignments (CUTLASS 2.x can_implement
only checks the problem extents) and returns CO_CANNOT_IMPLEMENT otherwise.
"""
from __future__ import annotations

from string import Template

from ..families.sm80 import gemm_configs
from ..ir import GemmKernel, KernelSource
from . import activations
from .epilogue_sm80 import (ELEMENT_TYPES, EPILOGUE_PLAIN, EPILOGUE_RESIDUAL, FAMILY,
                            INCLUDE_PLAIN_EPILOGUE, INCLUDE_RESIDUAL_EPILOGUE, INCLUDES_COMMON,
                            KERNEL, TILE_TYPES, check_alignments,
                            check_smem, check_warp_tiling, cp_async_ok, epilogue_values,
                            semantics, shape_values)

_LAYOUT = {"col": "cutlass::layout::ColumnMajor", "row": "cutlass::layout::RowMajor"}

_INCLUDES_PLAIN = INCLUDES_COMMON + (
    INCLUDE_PLAIN_EPILOGUE,
    "cutlass/gemm/device/gemm_universal.h",
)
_INCLUDES_RESIDUAL = INCLUDES_COMMON + (
    INCLUDE_RESIDUAL_EPILOGUE,
    "cutlass/gemm/device/gemm_universal_with_broadcast.h",
)

# ---------------------------------------------------------------------------
# C++ templates (string.Template, substituted strictly)
# ---------------------------------------------------------------------------

# Types shared by both variants.
_TYPES = ELEMENT_TYPES + """\
using LayoutA = ${layout_a};
using LayoutB = ${layout_b};
using LayoutC = cutlass::layout::RowMajor;
""" + TILE_TYPES + """
static cutlass::gemm::GemmUniversalMode mode(const CoGemmArgs& args) {
  return args.l == 1 ? cutlass::gemm::GemmUniversalMode::kGemm
                     : cutlass::gemm::GemmUniversalMode::kBatched;
}
static cutlass::gemm::GemmCoord extent(const CoGemmArgs& args) {
  return cutlass::gemm::GemmCoord(int(args.m), int(args.n), int(args.k));
}
"""

# The device GEMM's template arguments and make_arguments' head both variants share
_GEMM_PARAMS = """<
    ElementA, LayoutA, ElementB, LayoutB, ElementOutput, LayoutC, ElementAccumulator,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    ThreadblockShape, WarpShape, InstructionShape, EpilogueOp, Swizzle,
    kStages, kAlignA, kAlignB, cutlass::arch::OpMultiplyAdd>;

static typename Gemm::Arguments make_arguments(const CoGemmArgs& args) {
  return typename Gemm::Arguments(
      mode(args), extent(args), int(args.l),
      typename EpilogueOp::Params(ElementCompute(1), ElementCompute("""

# Variant 1: no residual. D = act(alpha * acc + bias_row); bias read as C with ldc = 0.
_PLAIN = EPILOGUE_PLAIN + """
using Gemm = cutlass::gemm::device::GemmUniversal""" + _GEMM_PARAMS + """${beta})),
      args.a, args.b, ${source_ptr}, args.d,
      args.batch_stride_a, args.batch_stride_b, /*batch_stride_c=*/0, args.batch_stride_d,
      args.lda, args.ldb, /*ldc=*/0, args.ldd);
}
"""

# Variant 2: residual. D = post(binary(act(alpha * acc + vector), beta * C)).
_RESIDUAL = EPILOGUE_RESIDUAL + """
using Gemm = cutlass::gemm::device::GemmUniversalWithBroadcast""" + _GEMM_PARAMS + """1)),
      args.a, args.b, args.c, args.d,
      /*ptr_Vector=*/${vector_ptr}, /*ptr_Tensor=*/nullptr,
      args.batch_stride_a, args.batch_stride_b, args.batch_stride_c, args.batch_stride_d,
      /*batch_stride_Vector=*/0, /*batch_stride_Tensor=*/0,
      args.lda, args.ldb, args.ldc, args.ldd, /*ldr=*/0, /*ldt=*/0);
}
"""

# Launcher shared by both variants: checks, workspace, initialize, run.
_LAUNCHER = """\
static bool aligned(const void* p, int64_t ld, int64_t batch_stride, int64_t elems, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % uintptr_t(elems * bytes) == 0 &&
         ld % elems == 0 && batch_stride % elems == 0;
}

// Problem and operand checks CUTLASS 2.x can_implement does not make.
static bool supported(const CoGemmArgs& args) {
  const int64_t kIntMax = INT32_MAX;
  if (args.m < 0 || args.n <= 0 || args.k <= 0 || args.l < 0) return false;
  if (args.m > kIntMax || args.n > kIntMax || args.k > kIntMax || args.l > kIntMax) return false;
  if (args.a == nullptr || args.b == nullptr || args.d == nullptr) return false;
  const int64_t e = int64_t(sizeof(ElementA));
  if (!aligned(args.a, args.lda, args.batch_stride_a, kAlignA, e)) return false;
  if (!aligned(args.b, args.ldb, args.batch_stride_b, kAlignB, e)) return false;
  if (!aligned(args.d, args.ldd, args.batch_stride_d, kAlignC, e)) return false;
${operand_checks}  return true;
}

int64_t workspace_size(const CoGemmArgs& args) {
  if (args.m == 0 || args.l == 0 || !supported(args)) return 0;
  return int64_t(Gemm::get_workspace_size(make_arguments(args)));
}

int run(const CoGemmArgs& args, cudaStream_t stream) {
  if (args.m < 0 || args.l < 0) return CO_CANNOT_IMPLEMENT;
  if (args.m == 0 || args.l == 0) return CO_OK;  // empty output: nothing to launch
  if (!supported(args)) return CO_CANNOT_IMPLEMENT;
  typename Gemm::Arguments arguments = make_arguments(args);
  if (Gemm::can_implement(arguments) != cutlass::Status::kSuccess) return CO_CANNOT_IMPLEMENT;
  size_t needed = Gemm::get_workspace_size(arguments);
  if (args.workspace_bytes < int64_t(needed)) return CO_WORKSPACE_TOO_SMALL;
  Gemm gemm;
  // No workspace pointer when none is needed: initialize() would memset it.
  if (gemm.initialize(arguments, needed ? args.workspace : nullptr, stream) != cutlass::Status::kSuccess)
    return CO_INIT_FAILED;
  if (gemm.run(stream) != cutlass::Status::kSuccess) return CO_LAUNCH_FAILED;
  if (cudaGetLastError() != cudaSuccess) return CO_LAUNCH_FAILED;
  return CO_OK;
}
"""

_CHECK_BIAS = """\
  if (args.bias == nullptr) return false;
  if (!aligned(args.bias, 0, 0, kAlignC, e)) return false;
"""
_CHECK_RESIDUAL = """\
  if (args.c == nullptr) return false;
  if (!aligned(args.c, args.ldc, args.batch_stride_c, kAlignC, e)) return false;
"""

# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def check(kernel: GemmKernel) -> None:
    """Raise ValueError unless ``kernel`` is a legal cutlass2x_sm80 instantiation.

    Checks family, arch, dtype/alignment/stages combinations (see the module
    docstring), the instruction shape for the dtype, tile/warp divisibility and
    the mainloop shared-memory budget of sm_80.
    """
    cfg = kernel.config
    if cfg.family != FAMILY:
        raise ValueError(f"gemm_sm80 emits only {FAMILY} kernels, got family {cfg.family!r}")
    if kernel.layout_a not in _LAYOUT:
        raise ValueError(f"layout_a must be 'row' or 'col', got {kernel.layout_a!r}")
    if kernel.layout_b not in _LAYOUT:
        raise ValueError(f"layout_b must be 'row' or 'col', got {kernel.layout_b!r}")
    if kernel.accumulate != "f32":
        raise ValueError(f"only f32 accumulation is supported, got {kernel.accumulate!r}")
    dtype = kernel.dtype
    check_alignments(dtype, align_a=kernel.align_a, align_b=kernel.align_b,
                     align_c=kernel.align_c)
    if dtype == "f32":
        if cfg.stages < 3:
            raise ValueError("TF32 kernels need stages >= 3: the 2-stage float mainloop "
                             "rounds operands to fp16 (OpMultiplyAddFastF16)")
    else:
        if cfg.stages < 2:
            raise ValueError(f"stages must be >= 2, got {cfg.stages}")
        if not cp_async_ok(dtype, kernel.align_a, kernel.align_b) and cfg.stages != 2:
            raise ValueError(
                f"{dtype} with align_a={kernel.align_a}, align_b={kernel.align_b} needs "
                f"stages=2 (MmaPipelined): cp.async copies only 4, 8 or 16 bytes, "
                f"got stages={cfg.stages}")
    check_warp_tiling(cfg, dtype)
    check_smem(cfg, dtype)


# ---------------------------------------------------------------------------
# Substitution values and emission
# ---------------------------------------------------------------------------

def values(kernel: GemmKernel) -> dict:
    """Return the substitution dict for the templates of ``kernel``.

    Keys cover both variants; each template uses the subset it needs. Raises
    ValueError (from ``check``) if the kernel is not a legal instantiation.
    """
    check(kernel)
    ep = kernel.epilogue
    residual = ep.residual != "none"
    operand_checks = (_CHECK_BIAS if ep.bias else "") + (_CHECK_RESIDUAL if residual else "")
    return {
        "name": kernel.name,
        "semantics": semantics(ep, "acc", "C"),
        "layout_a": _LAYOUT[kernel.layout_a],
        "layout_b": _LAYOUT[kernel.layout_b],
        **shape_values(kernel),
        **epilogue_values(ep),
        "operand_checks": operand_checks,
    }


def emit(kernel: GemmKernel) -> KernelSource:
    """Return the KernelSource (name, includes, code) of one cutlass2x_sm80 kernel.

    ``code`` defines ``namespace <kernel.name> { int64_t workspace_size(const
    CoGemmArgs&); int run(const CoGemmArgs&, cudaStream_t); }``; ``run`` returns
    a CoStatus. ``includes`` are header names relative to the CUTLASS include
    directories, to be emitted as ``#include "<name>"`` after prelude.h.
    Raises ValueError for an illegal kernel (see ``check``) and KeyError if a
    template placeholder has no value.
    """
    v = values(kernel)
    residual = kernel.epilogue.residual != "none"
    operation = Template(_RESIDUAL if residual else _PLAIN).substitute(v)
    code = Template(KERNEL).substitute(
        v,
        types=Template(_TYPES).substitute(v),
        operation=operation,
        launcher=Template(_LAUNCHER).substitute(v),
    )
    includes = _INCLUDES_RESIDUAL if residual else _INCLUDES_PLAIN
    return KernelSource(name=kernel.name, includes=includes, code=code,
                        preamble=activations.preamble(kernel.epilogue.activation))


# ---------------------------------------------------------------------------
# Known-good configurations
# ---------------------------------------------------------------------------


legal_configs = gemm_configs     # families/sm80.py (select reads it from there)
