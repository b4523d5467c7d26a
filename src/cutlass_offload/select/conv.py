"""Conv2d fprop kernel choice: sm90a TMA implicit GEMM where it applies, else 2.x.

The implicit GEMM is M = N * P * Q, N = K, K = R * S * C (ir.ConvProblem). Tile
choice is by CTA count, as for GEMMs (select/sm90.py): the largest tile that
still fills about a wave of the device's SMs.
"""
from __future__ import annotations

import math

from ..emit import conv_sm80, conv_sm90
from ..ir import ConvKernel, ConvProblem, KernelConfig

_BYTES = {"f16": 2, "bf16": 2, "f32": 4}


def _gemm_m(problem: ConvProblem) -> int:
    return problem.n_hint * problem.p * problem.q


def _sm90_config(problem: ConvProblem, num_sms: int) -> KernelConfig:
    m = _gemm_m(problem)
    candidates = conv_sm90.CANDIDATES
    for i, (tile, cluster, sched) in enumerate(candidates):
        ctas = math.ceil(m / tile[0]) * math.ceil(problem.k / tile[1])
        need = num_sms if i == 0 else num_sms // 2
        if ctas >= need or i == len(candidates) - 1:
            return KernelConfig("cutlass3x_sm90", tile, stages=0, cluster=cluster,
                                kernel_schedule=sched)
    raise AssertionError("unreachable")


def _sm80_config(problem: ConvProblem, num_sms: int, iterator: str) -> KernelConfig:
    configs = conv_sm80.legal_configs(problem.dtype, problem.align_a, problem.align_b,
                                      problem.align_c, iterator)
    if not configs:
        raise ValueError(f"no CUTLASS 2.x conv config for {problem}")
    m = _gemm_m(problem)
    for cfg in configs:
        if math.ceil(m / cfg.tile[0]) * math.ceil(problem.k / cfg.tile[1]) >= num_sms // 2:
            return cfg
    return configs[-1]


def choose_conv_kernel(problem: ConvProblem, arch: str, num_sms: int) -> ConvKernel:
    """The kernel for one conv problem on ``arch``; ValueError when none fits."""
    common = dict(arch=arch, dtype=problem.dtype, align_a=problem.align_a, align_b=problem.align_b,
                  align_c=problem.align_c, epilogue=problem.epilogue)
    if arch == "sm90a" and conv_sm90.supports(problem):
        return ConvKernel(config=_sm90_config(problem, num_sms), iterator="", **common)
    iterator = conv_sm80.choose_iterator(problem.dtype, problem.c, problem.align_a)
    if iterator in ("few_channels", "fixed_channels"):
        # Those iterators leave filter positions r >= R unmasked on the activation
        # side of the last K tile (zeros only on the filter side), so an inf/NaN
        # input could leak into a neighbouring output as 0 * inf. Small-C convs
        # are cheap (a network's stem): take the exact-masking iterators.
        iterator = "optimized" if problem.align_a * _BYTES[problem.dtype] >= 4 else "analytic"
    return ConvKernel(config=_sm80_config(problem, num_sms, iterator), iterator=iterator, **common)
