"""Emit one NHWC group_norm kernel (``nhwc_group_norm`` family), optionally with a
fused SiLU: x is (N, H*W, C) packed with the channel innermost (a channels_last
PyTorch tensor), channels [g * C/G, (g + 1) * C/G) form group g. Everything is
computed in fp32: y = (x - mean) * (rstd * w) + b, rounded to the dtype, then
silu(y) = y / (1 + exp(-y)) rounded again (PyTorch's two ops round there too, so
an fp16 overflow gives its inf / NaN); rstd = rsqrt(var + eps), biased variance
(PyTorch). An inf or NaN input makes its whole group NaN, as in PyTorch.

A thread block is ``bx`` vector columns (``vec`` elements, at most 16 bytes,
``cutlass::AlignedArray``) covering whole groups of a channel chunk, by ``by``
pixel lanes (at most 512 threads). A thread owns one column, hence one group, and
keeps up to 64 bytes (at most 16 vectors) of it in registers; it takes their exact
two-pass (mean, centred sum of squares) and folds it into its running (count,
mean, M2) with Chan et al.'s pairwise update; the threads of each group then
merge in a shared-memory tree. No E[x^2] - E[x]^2 cancellation anywhere: sound for
SD's 4096 * 40 elements per group and for tiny groups. Two launch plans, picked
per call (``make_plan``), no allocation, no host sync:

* fused, one launch, when a block can hold a whole (n, channel chunk) in
  registers (up to 16K 16-bit elements: SD's 8x8 and 16x16 norms, 320 channels at
  32x32): one block per (n, chunk), the fewest groups per chunk giving >= 64
  contiguous bytes per pixel; statistics, then normalize from registers.
* three launches otherwise: (1) stats over (n, chunk, pixel tile) blocks, about
  two per SM (N = 2, G = 32 at 64x64: 2 x 128 blocks of 160 x 3 threads, not the
  64 of one block per (n, group)); a tile is one contiguous memory range when
  the chunk is all of C; each group's tile (count, mean, M2) goes to the
  workspace; (2) finalize: one warp per (n, group) merges its tiles (Chan) into
  (mean, rstd), skipped with a single tile; (3) apply: same blocks, each thread
  reads its group's (mean, rstd) and its column's weight / bias once, then
  streams its pixels, four vectors in flight.

The workspace (three launches only) holds N * G (mean, rstd) and, with several
tiles, N * G * tiles (count, mean, M2); ``workspace_size`` says how much, nothing
needs initializing. ``run`` returns CO_CANNOT_IMPLEMENT for C % groups != 0, a
C / groups not a multiple of ``vec``, more than 512 vector columns in one group,
a misaligned or missing pointer; CO_WORKSPACE_TOO_SMALL for a short workspace.

Why not CUTLASS's tools/util/include/cutlass/util/device_groupnorm.h (NHWC too;
its kernels are templates, so it would link, unlike device_rmsnorm.h): one block
per (n, group) (64 blocks for SD's N = 2), 2-element vectors at most, 32-bit
indexing, gamma and beta required, bf16 handled through ``half2`` loads and a
float -> half -> bf16 conversion (double rounding, fp16 range), a printf instead
of a status for C % groups != 0, and no activation to fuse.
"""
from __future__ import annotations

from pathlib import Path
from string import Template

from ..dtypes import BYTES, CPP
from ..ir import GroupNormKernel, KernelSource

FAMILY = "nhwc_group_norm"

INCLUDES = ("cutlass/cutlass.h", "cutlass/array.h", "cutlass/numeric_types.h",
            "cutlass/numeric_conversion.h")

# Shared by every group norm kernel of a translation unit, inlined once per TU
# (include guard): templates/nhwc_group_norm.cuh, hand-written CUDA (templates only, so the same
# instantiation in two objects of one library links once).
_COMMON = (Path(__file__).parent / "templates" / "nhwc_group_norm.cuh").read_text()

_KERNEL = """\
namespace ${name} {

int64_t workspace_size(const CoGroupNormArgs& args) {
  return co_nhwc_group_norm::workspace_size<${element}, ${vec}>(args);
}

int run(const CoGroupNormArgs& args, cudaStream_t stream) {
  return co_nhwc_group_norm::run<${element}, ${vec}, ${weight}, ${bias}, ${silu}>(args, stream);
}

}  // namespace ${name}
"""


def check(kernel: GroupNormKernel) -> None:
    """Raise ValueError unless this family can build ``kernel``."""
    if kernel.config.family != FAMILY:
        raise ValueError(f"{kernel.name}: not a {FAMILY} kernel")
    if kernel.vec * BYTES[kernel.dtype] > 16:
        raise ValueError(f"{kernel.name}: vectors are at most 16 bytes")


def emit(kernel: GroupNormKernel) -> KernelSource:
    """The KernelSource of one group_norm kernel: ``namespace <kernel.name> {
    int64_t workspace_size(const CoGroupNormArgs&); int run(const CoGroupNormArgs&,
    cudaStream_t); }`` (run returns a CoStatus), preceded by the shared kernel
    templates (guarded: one copy per translation unit)."""
    check(kernel)

    def flag(b):
        return "true" if b else "false"
    body = Template(_KERNEL).substitute(
        name=kernel.name, element=CPP[kernel.dtype], vec=kernel.vec,
        weight=flag(kernel.weight), bias=flag(kernel.bias), silu=flag(kernel.silu))
    return KernelSource(name=kernel.name, includes=INCLUDES, code=_COMMON + "\n" + body,
                        args_type="CoGroupNormArgs")
