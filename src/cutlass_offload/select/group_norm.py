"""Group norm kernel choice: nothing to tune at compile time. The vector width is
the problem's alignment (the largest of 8/4/2/1 elements, at most 16 bytes,
dividing C / groups); the launch shape is picked per call from N, H, W, C, groups
and the GPU's SM count (emit/group_norm.py). The same kernel serves sm_80 and
sm_90a."""
from __future__ import annotations

from ..ir import GroupNormKernel, GroupNormProblem


def choose_group_norm_kernel(problem: GroupNormProblem, arch: str) -> GroupNormKernel:
    """The kernel for one group_norm problem on ``arch``; ValueError when none fits."""
    return GroupNormKernel(arch=arch, dtype=problem.dtype, vec=problem.align, weight=problem.weight,
                           bias=problem.bias, silu=problem.silu)
