"""Norm kernel choice: nothing to tune at compile time. The vector width is the
problem's alignment (the largest of 8/4/2/1 elements, at most 16 bytes, dividing
cols); the block size is picked per call from cols (emit/norm.py). The same
kernel serves sm_80 and sm_90a."""
from __future__ import annotations

from ..ir import NormKernel, NormProblem


def choose_norm_kernel(problem: NormProblem, arch: str) -> NormKernel:
    """The kernel for one norm problem on ``arch``; ValueError when none fits."""
    return NormKernel(arch=arch, kind=problem.kind, dtype=problem.dtype, vec=problem.align,
                      weight=problem.weight, bias=problem.bias, unit_offset=problem.unit_offset)
