"""CUTLASS 2.x (sm80 tensor-core) config choice among the legal configs.

Serves sm80 targets, and on sm90a the problems TMA cannot handle (alignment
below 16 bytes, an operand broadcast over the batch).
"""
from __future__ import annotations

import math

from ..emit.gemm_sm80 import legal_configs
from ..ir import GemmProblem, KernelConfig


def choose(problem: GemmProblem, num_sms: int) -> KernelConfig:
    """Largest legal tile giving at least half a wave of CTAs, else the smallest."""
    configs = legal_configs(problem.dtype, problem.align_a, problem.align_b, problem.align_c)
    if not configs:
        raise ValueError(f"no CUTLASS 2.x config for {problem}")
    m = problem.m_hint * (problem.batch_hint if problem.batch != 1 else 1)
    for cfg in configs:
        ctas = math.ceil(m / cfg.tile[0]) * math.ceil(problem.n / cfg.tile[1])
        if ctas >= num_sms // 2:
            return cfg
    return configs[-1]
