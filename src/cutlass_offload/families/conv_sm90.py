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

# The shape rule's tiles (select/conv.py): (tile, cluster, kernel schedule, throughput
# per CTA relative to 128x128), largest first. The rule picks the tile with the least
# ceil(CTAs / SMs) x tile area / throughput: whole waves of CTAs, each costing its area
# at its tile's speed. The throughputs and the choices come from an H200 search of
# the 53 TMA convs of the kernel corpus (benchmarks/results/kernels_conv_search_*): this
# model's choice ran 1.01x the best searched tile's time (geomean, worst 1.29x; the
# thresholds on CTA counts it replaced, 1.05x); the learned conv table (families/conv_sm90_table.py)
# holds the measured winner where it beat the rule by 2%. No cluster: clustered CTAs
# must share a GPC, so a grid of about a wave of them spills into a second (the VAE's
# 64 x 64 x 512 -> 512, 128 CTAs of 128 x 128: 48.1 us with a 2x1 cluster, 28.6
# without), and the search found the 2x1 cluster's filter multicast worth under 1%
# where it won at all. 128x160 only where it divides K (the SD UNet's 320-multiples:
# no half-empty last tile). One consumer warpgroup holds the tile's accumulators.
CANDIDATES = (
    ((128, 160, 64), (1, 1, 1), KERNEL_SCHEDULE, 1.0),
    ((128, 128, 64), (1, 1, 1), KERNEL_SCHEDULE, 1.0),
    ((64, 128, 64), (1, 1, 1), KERNEL_SCHEDULE, 0.75),
    ((128, 64, 64), (1, 1, 1), KERNEL_SCHEDULE, 0.75),
    ((64, 64, 64), (1, 1, 1), KERNEL_SCHEDULE, 0.5),
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
