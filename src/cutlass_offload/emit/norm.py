"""Emit one row-wise normalization kernel (``rowwise_norm`` family): layer_norm or
rms_norm over the last axis, x viewed as packed (rows, cols).

Design: one row per thread block (blockDim.x threads, a multiple of 32, about two
vectors of ``vec`` elements per thread), or, for short rows (blockDim.x == 32),
one warp per row and four rows per block. Loads and stores are ``vec``-element
vectors (``cutlass::AlignedArray``, at most 16 bytes); everything is computed in
fp32 (``cutlass::NumericArrayConverter``) and rounded once on the store. The row
is kept in registers when it fits (up to 4 vectors per thread: 32768 fp16 /
16384 fp32 columns), else it is read again from global memory (L2) per pass.
layer_norm is two-pass (the mean, then the centred sum of squares: no
cancellation, unlike E[x^2] - E[x]^2), biased variance, like PyTorch;
rms_norm needs only the sum of squares. weight and bias are optional
(compile-time; a zero-centred weight scales by 1 + weight, ``unit_offset``), eps
is a runtime argument. The launcher never allocates, launches on the given stream and returns CO_CANNOT_IMPLEMENT for a cols that is
not a multiple of ``vec``, a misaligned or missing pointer, or too many rows.

Why not CUTLASS's own (tools/util/include/cutlass/util):

* ``device_layernorm.h`` adds a hard-coded 1e-5 (``rsqrtf(... + 1e-5)``), so any
  other eps (BERT's 1e-12, 1e-6 in many models) would be silently wrong.
* ``device_rmsnorm.h`` takes eps, but defines a non-template, non-inline
  ``__global__ rmsnorm_twoPassAlgo_e8`` in the header: two objects of one library
  that include it (two shards, a cached shard reused next to a new one, the
  per-region modules) fail to link with "multiple definition of
  cutlass::rmsnorm_twoPassAlgo_e8" (checked with nvcc 13.0). Its host wrapper
  also abort()s the process on a launch error, vectorizes only fp16 with
  cols % 8 == 0 (bf16 / fp32 get scalar loads) and requires a weight.
So both kinds use the kernel below; CUTLASS provides the numeric types, the
aligned vectors and the conversions.
"""
from __future__ import annotations

from pathlib import Path
from string import Template

from ..dtypes import BYTES, CPP
from ..ir import KernelSource, NormKernel

FAMILY = "rowwise_norm"
CACHED_VECTORS = 4     # vectors per thread kept in registers: kCachedVectors of templates/rowwise_norm.cuh

INCLUDES = ("cutlass/cutlass.h", "cutlass/array.h", "cutlass/numeric_types.h",
            "cutlass/numeric_conversion.h")

# Shared by every norm kernel of a translation unit, inlined once per TU
# (include guard): templates/rowwise_norm.cuh, hand-written CUDA (templates only, so the same
# instantiation in two objects of one library links once).
_COMMON = (Path(__file__).parent / "templates" / "rowwise_norm.cuh").read_text()

_KERNEL = """\
namespace ${name} {

using Element = ${element};
constexpr int kVec = ${vec};
constexpr bool kRms = ${rms};
constexpr bool kWeight = ${weight};
constexpr bool kBias = ${bias};
constexpr bool kUnitOffset = ${unit_offset};

static bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % uintptr_t(kVec * sizeof(Element)) == 0;
}

int64_t workspace_size(const CoNormArgs&) { return 0; }

int run(const CoNormArgs& args, cudaStream_t stream) {
  if (args.rows < 0 || args.cols <= 0 || args.cols % kVec != 0) return CO_CANNOT_IMPLEMENT;
  if (args.rows == 0) return CO_OK;  // empty output: nothing to launch
  if (args.input == nullptr || args.output == nullptr) return CO_CANNOT_IMPLEMENT;
  if (!aligned(args.input) || !aligned(args.output)) return CO_CANNOT_IMPLEMENT;
  if (kWeight && (args.weight == nullptr || !aligned(args.weight))) return CO_CANNOT_IMPLEMENT;
  if (kBias && (args.bias == nullptr || !aligned(args.bias))) return CO_CANNOT_IMPLEMENT;
  const int64_t nvec = args.cols / kVec;
  // about two vectors per thread, a whole number of warps, at most 1024 threads
  int64_t threads = ((nvec + 1) / 2 + 31) / 32 * 32;
  threads = threads < 32 ? 32 : (threads > 1024 ? 1024 : threads);
  const int64_t rows_per_block = threads == 32 ? 4 : 1;  // short rows: a warp per row
  const int64_t blocks = (args.rows + rows_per_block - 1) / rows_per_block;
  if (blocks > int64_t(INT32_MAX)) return CO_CANNOT_IMPLEMENT;
  co_rowwise_norm::rowwise_norm_kernel<Element, kVec, kRms, kWeight, kBias, kUnitOffset>
      <<<dim3(unsigned(blocks)), dim3(unsigned(threads), unsigned(rows_per_block)), 0, stream>>>(
          static_cast<const Element*>(args.input), static_cast<const Element*>(args.weight),
          static_cast<const Element*>(args.bias), static_cast<Element*>(args.output),
          args.rows, args.cols, args.eps);
  if (cudaGetLastError() != cudaSuccess) return CO_LAUNCH_FAILED;
  return CO_OK;
}

}  // namespace ${name}
"""


def check(kernel: NormKernel) -> None:
    """Raise ValueError unless this family can build ``kernel``."""
    if kernel.config.family != FAMILY:
        raise ValueError(f"{kernel.name}: not a {FAMILY} kernel")
    if kernel.vec * BYTES[kernel.dtype] > 16:
        raise ValueError(f"{kernel.name}: vectors are at most 16 bytes")


def emit(kernel: NormKernel) -> KernelSource:
    """The KernelSource of one norm kernel: ``namespace <kernel.name> { int64_t
    workspace_size(const CoNormArgs&); int run(const CoNormArgs&, cudaStream_t); }``
    (run returns a CoStatus), preceded by the shared kernel template (guarded, so
    several norm kernels share one copy per translation unit)."""
    check(kernel)
    common = _COMMON
    body = Template(_KERNEL).substitute(
        name=kernel.name, element=CPP[kernel.dtype], vec=kernel.vec,
        rms="true" if kernel.kind == "rms_norm" else "false",
        weight="true" if kernel.weight else "false", bias="true" if kernel.bias else "false",
        unit_offset="true" if kernel.unit_offset else "false")
    return KernelSource(name=kernel.name, includes=INCLUDES, code=common + "\n" + body,
                        args_type="CoNormArgs")
