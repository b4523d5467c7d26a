"""Candidate CUTLASS 3.x sm90a (TMA warp-specialized) configs and a shape heuristic.

3.x kernels need 16-byte aligned operands (TMA), so they serve f16/bf16 problems
with alignment 8 everywhere; the rest go to the 2.x kernels (select/sm80.py).
Tile choice: the largest tile that still gives about a wave of CTAs on the
device (num_sms), so small M never gets a 128x256 tile (design.md: a fixed
128x256 tile ran 77x1280x768 at 17.5 us against PyTorch's 10.6 us).
"""
from __future__ import annotations

import math

from ..ir import GemmProblem, KernelConfig

COOP = "KernelTmaWarpSpecializedCooperative"
PINGPONG = "KernelTmaWarpSpecializedPingpong"

# Largest first: (tile, cluster, kernel schedule)
CANDIDATES = (
    ((128, 256, 64), (2, 1, 1), COOP),
    ((128, 128, 64), (1, 1, 1), COOP),
    ((64, 128, 64), (1, 1, 1), PINGPONG),
)


def supports(problem: GemmProblem) -> bool:
    """True when a 3.x TMA kernel can run this problem class at all."""
    return (problem.dtype in ("f16", "bf16")
            and (problem.align_a, problem.align_b, problem.align_c) == (8, 8, 8)
            and not problem.a_batch_broadcast)


def choose(problem: GemmProblem, num_sms: int) -> KernelConfig:
    """Pick a tile by CTA count; see the module docstring."""
    m = problem.m_hint * max(1, problem.batch_hint if problem.batch != 1 else 1)
    for i, (tile, cluster, sched) in enumerate(CANDIDATES):
        ctas = math.ceil(m / tile[0]) * math.ceil(problem.n / tile[1])
        # the biggest tile needs a full wave; the middle one half a wave
        need = num_sms if i == 0 else num_sms // 2
        if ctas >= need or i == len(CANDIDATES) - 1:
            return KernelConfig("cutlass3x_sm90", tile, stages=0, cluster=cluster,
                                kernel_schedule=sched)
    raise AssertionError("unreachable")
