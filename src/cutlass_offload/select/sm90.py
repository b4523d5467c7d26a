"""Candidate CUTLASS 3.x sm90a (TMA warp-specialized) configs and a shape heuristic.

3.x kernels need 16-byte aligned operands (TMA), so they serve f16/bf16 problems
with alignment 8 everywhere; the rest go to the 2.x kernels (select/sm80.py).

Six configs (each distinct config x epilogue is one ~7 s compile on the 16-core
host, so a model should meet only a few of them):

========  ==============  =======  ===========  ============================================
name      tile (M, N, K)  cluster  schedule     for
========  ==============  =======  ===========  ============================================
big       128x256x64      2x1      cooperative  1.5 waves of CTAs or more (4096^3: 638 TFLOP/s)
mid       128x128x64      1x1      cooperative  M > 1024 and half a wave of 128x128 tiles
small     64x128x64       1x1      ping-pong    M <= 1024 (below 1.5 waves of big tiles), or few
                                                tiles
wide      64x256x64       1x1      ping-pong    small M with a wide N (a wave of 64x256 tiles)
narrow    128x64x64       1x1      cooperative  N <= 64 (a 128-wide tile would be half empty)
stream_k  128x128x64      1x1      cooperative  a --tune candidate only (far fewer tiles than
                                   + stream-K   SMs and a long K; CUTLASS's heuristic
                                                decomposition: data-parallel, split-K or
                                                stream-K per problem)
========  ==============  =======  ===========  ============================================

``choose`` is a pure function of the problem and the SM count; the thresholds
follow the CTA-count argument (design.md: a fixed 128x256 tile ran 77x1280x768 at
17.5 us against PyTorch's 10.6 us, i.e. a tile must not leave most SMs idle) and
the --tune profiles of the built-in models on an H200 (CUDA-graph timing, us):

* 64x128 ping-pong beat 128x128 cooperative on every M <= 1024 GEMM profiled:
  BERT/GPT-2 1024x3072x768 16.3 vs 18.1, 1024x2304x768 11.2 vs 13.1,
  1024x768x3072 12.7 vs 19.0, 1024x768x768 5.8 vs 7.4;
* 128x256 lost to it at 1.2 waves (UNet 512x10240x1280: 32.2 vs 24.3) and tied
  128x128 at 2.4 waves (2048x5120x640: 28.2 vs 27.6): big needs 1.5 waves;
* stream-K lost on all nine problems it was profiled on (UNet 128x1280x5120: 31.5 vs
  16.6 for ping-pong; BERT/GPT-2 1.4-1.7x the best), so the heuristic never picks it.

``candidates`` lists at most four configs for on-GPU profiling (``--tune``),
the heuristic's choice first.
"""
from __future__ import annotations

import math

from ..ir import GemmProblem, KernelConfig

COOP = "KernelTmaWarpSpecializedCooperative"
PINGPONG = "KernelTmaWarpSpecializedPingpong"


def _config(tile, cluster, sched, scheduler="persistent") -> KernelConfig:
    return KernelConfig("cutlass3x_sm90", tile, stages=0, cluster=cluster, kernel_schedule=sched,
                        tile_scheduler=scheduler)


CONFIGS = {
    "big": _config((128, 256, 64), (2, 1, 1), COOP),
    "mid": _config((128, 128, 64), (1, 1, 1), COOP),
    "small": _config((64, 128, 64), (1, 1, 1), PINGPONG),
    "wide": _config((64, 256, 64), (1, 1, 1), PINGPONG),
    "narrow": _config((128, 64, 64), (1, 1, 1), COOP),
    "stream_k": _config((128, 128, 64), (1, 1, 1), COOP, "stream_k"),
}
SMALL_M = 128            # rows: up to here a 64-row ping-pong tile wastes least
PINGPONG_MAX_M = 1024    # rows: up to here 64x128 ping-pong beat 128x128 cooperative (measured)
BIG_MIN_WAVES = 1.5      # waves of 128x256 tiles below which they lost (measured)
MAX_CANDIDATES = 4


def supports(problem: GemmProblem) -> bool:
    """True when a 3.x TMA kernel can run this problem class at all."""
    return (problem.dtype in ("f16", "bf16")
            and (problem.align_a, problem.align_b, problem.align_c) == (8, 8, 8)
            and not problem.a_batch_broadcast)


def gemm_mnk(problem: GemmProblem) -> tuple:
    """(M, N, K) the tiles cover: the example's rows, times the batch for a batched
    GEMM (every batch entry is tiled on its own)."""
    m = problem.m if problem.m is not None else problem.m_hint
    batch = problem.batch if problem.batch is not None else problem.batch_hint
    return m * max(1, batch), problem.n, problem.k


def _ctas(problem: GemmProblem, name: str) -> int:
    m, n, _ = gemm_mnk(problem)
    tm, tn, _ = CONFIGS[name].tile
    return math.ceil(m / tm) * math.ceil(n / tn)


def choose_name(problem: GemmProblem, num_sms: int) -> str:
    """The heuristic's config name (a key of ``CONFIGS``); see the module docstring."""
    m, n, _ = gemm_mnk(problem)
    if m <= SMALL_M:
        return "wide" if n >= 256 and _ctas(problem, "wide") >= num_sms else "small"
    if _ctas(problem, "big") >= BIG_MIN_WAVES * num_sms:
        return "big"
    if n <= 64:
        return "narrow"
    if m > PINGPONG_MAX_M and _ctas(problem, "mid") >= num_sms // 2:
        return "mid"
    return "small"


def choose(problem: GemmProblem, num_sms: int) -> KernelConfig:
    """The heuristic's config for ``problem`` on a device with ``num_sms`` SMs."""
    return CONFIGS[choose_name(problem, num_sms)]


def _plausible(problem: GemmProblem, name: str, num_sms: int) -> bool:
    """Whether profiling ``name`` on this problem could pay off (cheap filters only)."""
    m, n, k = gemm_mnk(problem)
    return {
        "big": m > 64 and _ctas(problem, "big") * 4 >= num_sms,
        "mid": m > 64,
        "small": True,
        "stream_k": k >= 512 and _ctas(problem, "mid") < 2 * num_sms,
        "wide": m <= 2 * SMALL_M and n >= 256,
        "narrow": n <= 128 and m > 64,
    }[name]


def candidates(problem: GemmProblem, num_sms: int) -> tuple:
    """At most ``MAX_CANDIDATES`` configs to profile: the heuristic's first, then the
    plausible others in ``CONFIGS`` order."""
    first = choose_name(problem, num_sms)
    names = [first] + [n for n in CONFIGS if n != first and _plausible(problem, n, num_sms)]
    return tuple(CONFIGS[n] for n in names[:MAX_CANDIDATES])
