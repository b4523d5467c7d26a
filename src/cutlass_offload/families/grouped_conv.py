"""Grouped conv2d fprop (channel groups, 1 < groups, not depthwise: ResNeXt, RegNet)
on CUTLASS 2.x's grouped implicit GEMM (``DefaultConv2dGroupFprop``, family
``cutlass2x_sm80``; also run on sm_90a): which problems run, in which group mode,
on which tile.

What the kernel does, read from CUTLASS 4.2 (conv/kernel/default_conv2d_group_fprop.h,
conv/device/implicit_gemm_convolution.h ``can_implement``, conv/conv2d_problem_size.h
``implicit_gemm_k_iterations``): the implicit GEMM's N is K, each group's K tile walks
R * S * ceil(C_g / tile_k) iterations over its own C_g = C / groups input channels.

* ``single`` group mode (kSingleGroup): every CTA's N tile lies in one group, so
  K_g = K / groups must be a multiple of the tile's N. Analytic or optimized
  activation iterator; the optimized one masks x's channels against C, not C_g
  (conv2d_fprop_activation_tile_access_iterator_optimized.h), so a K tile running
  past a group's channels reads the next group's x against a zeroed filter (a
  non-finite x would leak as NaN): it is taken only when C_g is whole K tiles.
* Not CUTLASS's ``multiple`` group mode (kMultipleGroup: a CTA's N tile holds
  tile_n / K_g whole groups, for K_g below a tile's N). Tried on the H200 in session
  32 (tests/gpu/test_grouped_conv_gpu.py, 64 x 16 tiles of two warps, analytic
  iterator): rows 32-39 of every 32-row block but the first came out wrong for any
  C_g, R, S tried (the first rows each warp loads), while the single-group kernels
  (64- and 32-wide tiles) matched on 90 random problems and a ResNeXt block. Not
  diagnosed further; 16-wide tiles are left out with it. Problems with K_g not a
  multiple of 32 (ResNeXt-50's 4, 8 and 16 channels per group) stay in PyTorch.
* C_g a multiple of the operand alignment (16-byte accesses read one group's
  channels), no split-K, no residual epilogue (there is no grouped variant of the
  fused-epilogue kernel; a residual add stays in the glue: partition/checks.py
  ``kernel_takes_residual``).

Waste: the K tile is 32 channels, so C_g = 8 does a quarter useful work. Problems
whose useful share of MMA work would fall below 1 / MAX_WASTE stay in PyTorch with
the figure as the reason (a rule of thumb, not measured against cuDNN; cuDNN has
kernels for small groups).
"""
from __future__ import annotations

import math

from ..dtypes import BYTES
from ..ir import ConvKernel, ConvProblem
from . import sm80

MAX_WASTE = 4.0       # at most 4x the useful MMA work (see the module docstring)
TILE_K = 32           # every sm80 conv config's K tile (families/sm80.py)


def _k_waste(c_g: int) -> float:
    return math.ceil(c_g / TILE_K) * TILE_K / c_g


def candidates(problem: ConvProblem) -> list:
    """(iterator, config) the single-group kernel can take for ``problem`` (the only
    group mode used, see the module docstring), largest tile first."""
    k_g = problem.k // problem.groups
    # the optimized activation iterator masks channels against C, not C_g: a K tile
    # past a group's end reads the next group's x (times zero filter: a non-finite x
    # would leak as NaN), so it takes only groups of whole K tiles
    optimized = (sm80.cp_async_ok(problem.dtype, problem.align_a, problem.align_b)
                 and (problem.c // problem.groups) % TILE_K == 0)
    wide = sm80.known_configs(problem.dtype, problem.align_a, problem.align_b)
    # 32-wide narrow tiles, not 16-wide: the failing multiple-group kernels were all
    # 16 wide, and no single-group 16-wide kernel has run on a GPU yet
    narrow = sm80.narrow_configs(problem.dtype, problem.align_a, problem.align_b, 32)
    return [("optimized" if optimized else "analytic", c) for c in wide + narrow
            if k_g % c.tile[1] == 0]


def waste(problem: ConvProblem) -> float:
    """MMA work done per useful unit: the K tile's padding of C_g (the same for every
    tile in single-group mode)."""
    return _k_waste(problem.c // problem.groups)


def reason(problem: ConvProblem) -> str | None:
    """Why the grouped kernel cannot run ``problem`` (a sentence), or None."""
    if not problem.grouped:
        return "not a grouped conv (1 < groups, not depthwise)"
    if problem.dtype not in ("f16", "bf16"):
        return "an fp32 grouped conv stays in PyTorch (the grouped kernels are fp16 / bf16)"
    c_g, k_g = problem.c // problem.groups, problem.k // problem.groups
    if c_g * BYTES[problem.dtype] < 4 or problem.align_a * BYTES[problem.dtype] < 4:
        return (f"grouped conv with {c_g} input channels per group: the kernel reads a "
                "group's channels at least 4 bytes at a time")
    if not candidates(problem):
        return (f"grouped conv with K / groups = {k_g}, not a multiple of 32 (a tile's N): "
                "CUTLASS's several-groups-per-tile mode wrote wrong rows on the H200, so it "
                "is not used (families/grouped_conv.py)")
    w = waste(problem)
    if w > MAX_WASTE:
        return (f"grouped conv with C / groups = {c_g} and K / groups = {k_g}: CUTLASS's grouped "
                f"kernel would do {w:.0f}x the useful MMA work (32-channel K tiles); stays "
                "in PyTorch")
    return None


def choose(problem: ConvProblem, arch: str, num_sms: int) -> ConvKernel:
    """The grouped kernel for ``problem``: of the candidates, largest tile first, the
    first that gives at least half a wave of CTAs (as for the 2.x convs:
    select/conv.py ``_sm80_config``), else the one with the most CTAs. ValueError
    with the reason when none runs it."""
    why = reason(problem)
    if why is not None:
        raise ValueError(why)
    choices = candidates(problem)
    m_rows = problem.n_hint * problem.p * problem.q

    def ctas(c):
        return math.ceil(m_rows / c.tile[0]) * math.ceil(problem.k / c.tile[1])
    iterator, config = next(((it, c) for it, c in choices if ctas(c) >= num_sms // 2),
                            max(choices, key=lambda ic: ctas(ic[1])))
    return ConvKernel(arch=arch, dtype=problem.dtype, align_a=problem.align_a,
                      align_b=problem.align_b, align_c=problem.align_c, epilogue=problem.epilogue,
                      config=config, iterator=iterator, groups=problem.groups, group_mode="single")
