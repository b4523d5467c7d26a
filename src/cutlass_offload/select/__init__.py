"""Select: regions -> kernel instantiations (a pure function of problem and target)."""
from __future__ import annotations

from ..config import CompileOptions
from ..ir import (AttentionRegion, ConvRegion, Fallback, GemmKernel, GemmProblem, GroupNormRegion,
                  NormRegion, PartitionResult, Plan)
from ..emit import attention            # the sm80 kernel, for sm_80 and sm_90a
from . import sm80, sm90
from .conv import choose_conv_kernel
from .group_norm import choose_group_norm_kernel
from .norm import choose_norm_kernel

DEFAULT_NUM_SMS = {"sm90a": 132, "sm80": 108}  # H100/H200 SXM, A100 (vendor datasheets)


def choose_kernel(problem: GemmProblem, arch: str, num_sms: int | None = None) -> GemmKernel:
    """The kernel for one problem on ``arch`` ("sm90a" or "sm80").

    Raises ValueError when no kernel family can run the problem class.
    """
    num_sms = num_sms or DEFAULT_NUM_SMS[arch]
    if problem.epilogue.residual_broadcast:
        raise ValueError("GEMM kernels take a full-shape residual only")
    if arch == "sm90a" and sm90.supports(problem):
        config = sm90.choose(problem, num_sms)
    else:
        config = sm80.choose(problem, num_sms)
    return GemmKernel(arch=arch, dtype=problem.dtype, layout_b=problem.layout_b,
                      align_a=problem.align_a, align_b=problem.align_b, align_c=problem.align_c,
                      epilogue=problem.epilogue, config=config, layout_a=problem.layout_a)


def select(part: PartitionResult, arch: str, options: CompileOptions = CompileOptions()) -> Plan:
    """Choose a kernel per region; regions with no legal kernel become fallbacks."""
    regions, kernels, fallbacks = [], [], list(part.fallbacks)
    for r in part.regions:
        try:
            if isinstance(r, NormRegion):
                k = choose_norm_kernel(r.problem, arch)
            elif isinstance(r, GroupNormRegion):
                k = choose_group_norm_kernel(r.problem, arch)
            elif isinstance(r, AttentionRegion):
                k = attention.choose(r.kernel_problem, arch)
            elif isinstance(r, ConvRegion):
                k = choose_conv_kernel(r.problem, arch, options.num_sms or DEFAULT_NUM_SMS[arch])
            else:
                k = choose_kernel(r.problem, arch, options.num_sms)
        except ValueError as e:
            fallbacks.append(Fallback(r.nodes[0], r.form, f"no kernel: {e}"))
            continue
        regions.append(r)
        kernels.append(k)
    return Plan(arch=arch, regions=tuple(regions), kernels=tuple(kernels), fallbacks=tuple(fallbacks))
