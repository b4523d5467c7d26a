"""CUTLASS 2.x (sm80 tensor-core) config choice among the legal configs.

Serves sm80 targets, and on sm90a the problems TMA cannot handle (alignment
below 16 bytes, an operand broadcast over the batch).
"""
from __future__ import annotations

import math

from ..families.sm80 import gemm_configs
from ..ir import GemmProblem, KernelConfig


def _index(problem: GemmProblem, num_sms: int, configs) -> int:
    m = problem.m_hint * (problem.batch_hint if problem.batch != 1 else 1)
    for i, cfg in enumerate(configs):
        ctas = math.ceil(m / cfg.tile[0]) * math.ceil(problem.n / cfg.tile[1])
        if ctas >= num_sms // 2:
            return i
    return len(configs) - 1


def _legal(problem: GemmProblem) -> list:
    configs = gemm_configs(problem.dtype, problem.align_a, problem.align_b, problem.align_c)
    if not configs:
        raise ValueError(f"no CUTLASS 2.x config for {problem}")
    return configs


def choose(problem: GemmProblem, num_sms: int) -> KernelConfig:
    """Largest legal tile giving at least half a wave of CTAs, else the smallest."""
    configs = _legal(problem)
    return configs[_index(problem, num_sms, configs)]


def candidates(problem: GemmProblem, num_sms: int, limit: int = 4) -> tuple:
    """At most ``limit`` legal configs to profile: the heuristic's choice first, then
    its neighbours in the (largest first) legal list, nearest first."""
    configs = _legal(problem)
    i = _index(problem, num_sms, configs)
    order = sorted(range(len(configs)), key=lambda j: (abs(j - i), j))
    return tuple(configs[j] for j in order[:limit])
