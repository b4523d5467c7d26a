"""CUTLASS 3.x sm90a implicit-GEMM conv2d fprop (family ``cutlass3x_sm90``): the
candidate tiles and which problems it can run (emit/conv_sm90.py writes the C++
and explains the kernel).

* TMA im2col limits (sm90_implicit_gemm_gmma_ss_warpspecialized.hpp can_implement,
  and cuTensorMapEncodeIm2col): padding in [0, 256]; corners -pad and
  upper - (R-1)*dil in [-128, 127]; filter offsets (R-1)*dil < 255; traversal
  stride <= 8 (CUTLASS does not check the stride, and under NDEBUG a failed
  descriptor encode is silent, so run() checks it); 16-byte aligned base
  pointers and channel strides (C % 8 == 0, K % 8 == 0 for 16-bit types).
"""
from __future__ import annotations

from ..ir import ConvProblem, KernelConfig

FAMILY = "cutlass3x_sm90"

# The one sm90 conv kernel schedule in CUTLASS 4.2 (see emit/conv_sm90.py's docstring)
# and the epilogue schedule it must be paired with.
KERNEL_SCHEDULE = "KernelImplicitTmaWarpSpecializedSm90"
EPILOGUE_SCHEDULE = "TmaWarpSpecialized"

# Largest first: (tile, cluster, kernel schedule). 128x128 with a 2x1 cluster
# (the filter tile is multicast to the two CTAs along M: every M tile reads the
# same filter) for more than a wave of tiles; 128x128 without a cluster from half a
# wave to a wave (clustered CTAs must share a GPC, so about a wave of them can spill
# into a second: the VAE's 64 x 64 x 512 -> 512, 128 CTAs, 48.1 us with the cluster,
# 28.6 without; the SD UNet's 80-CTA 32 x 32 convs 1.3x faster without, H200 conv
# search); 64x128 for a smaller grid (the UNet's 16 x 16 x 1280-2560 -> 1280: 0.93x
# -> 0.87x of 128x64's time); 128x64 for the many 64-channel layers (no half-empty N
# tile); 64x64 for small spatial extents. One consumer warpgroup holds the tile's
# accumulators (128 fp32 registers per thread for 128x128). The learned conv table
# (families/conv_sm90_table.py) overrides this rule on the shapes it measured.
CANDIDATES = (
    ((128, 128, 64), (2, 1, 1), KERNEL_SCHEDULE),
    ((128, 128, 64), (1, 1, 1), KERNEL_SCHEDULE),
    ((64, 128, 64), (1, 1, 1), KERNEL_SCHEDULE),
    ((128, 64, 64), (2, 1, 1), KERNEL_SCHEDULE),
    ((64, 64, 64), (1, 1, 1), KERNEL_SCHEDULE),
)

# TMA im2col limits for 2 spatial dims (see the module docstring)
_MAX_PADDING = 256
_CORNER_LIMIT = 1 << (16 // 2 - 1)      # corners in [-128, 127]
_OFFSET_LIMIT = (1 << (16 // 2)) - 1    # (R-1)*dil < 255
_MAX_TRAVERSAL_STRIDE = 8
# fp32 accumulators per consumer thread: 160 admits a 128 x 160 tile (N = 320, 640,
# 960, 1280, 1920: the SD UNet's widths, with no half-empty last tile), leaving ~95
# of a thread's 255 registers for the rest; the conv search measures it beside
# 128 x 128 (benchmarks/_conv_search.py)
_MAX_ACC_PER_THREAD = 160


def _upper_pad(out: int, size: int, filt: int, lower: int, stride: int, dil: int) -> int:
    """Mirror of co_upper_pad in the C++ (clamped at 0)."""
    return max(0, (out - 1) * stride + dil * (filt - 1) + 1 - size - lower)


def _im2col_ok(size: int, filt: int, lower: int, out: int, stride: int, dil: int) -> bool:
    """One spatial dim within the TMA im2col limits (module docstring)."""
    upper = _upper_pad(out, size, filt, lower, stride, dil)
    reach = (filt - 1) * dil
    return (1 <= stride <= _MAX_TRAVERSAL_STRIDE
            and lower <= min(_MAX_PADDING, _CORNER_LIMIT) and upper <= _MAX_PADDING
            and -_CORNER_LIMIT <= upper - reach <= _CORNER_LIMIT - 1
            and reach < _OFFSET_LIMIT)


def supports(problem: ConvProblem) -> bool:
    """True when a cutlass3x_sm90 conv kernel can run this problem class at all:
    f16/bf16, the kernel's C (``c_kernel``: C plus any zero-padded channels) and
    K multiples of 8 (TMA 16-byte strides), and padding, stride and dilation
    within the TMA im2col limits. Sizes checked only at run time:
    N*P*Q <= INT32_MAX."""
    if problem.dtype not in ("f16", "bf16") or problem.tf32:
        return False
    if (problem.align_a, problem.align_b, problem.align_c) != (8, 8, 8):
        return False
    if problem.c_kernel % 8 or problem.k % 8:
        return False
    top, _, left, _ = problem.pad
    return (_im2col_ok(problem.h, problem.r, top, problem.p, problem.stride[0], problem.dilation[0])
            and _im2col_ok(problem.w, problem.s, left, problem.q, problem.stride[1],
                           problem.dilation[1]))


def make_config(tile: tuple, cluster: tuple, kernel_schedule: str = KERNEL_SCHEDULE,
                stages: int = 0) -> KernelConfig:
    """A KernelConfig for this family (e.g. from one CANDIDATES entry)."""
    return KernelConfig(FAMILY, tuple(tile), stages, cluster=tuple(cluster),
                        kernel_schedule=kernel_schedule, epilogue_schedule=EPILOGUE_SCHEDULE)
