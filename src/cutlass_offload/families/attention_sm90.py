"""CUTLASS's Hopper fused multi-head attention forward (examples/88_hopper_fmha,
family ``cutlass3x_sm90``): which problems it runs and with which head tile
(emit/attention_sm90.py writes the C++ and explains the kernel's limits).
"""
from __future__ import annotations

import math

from ..ir import AttentionKernelSm90, AttentionProblem, KernelConfig

FAMILY = "cutlass3x_sm90"
ARCH = "sm90a"
DTYPES = ("f16", "bf16")
SCHEDULE = "KernelTmaWarpSpecializedCooperative"
STAGES = 5                   # kStagesKV default (fmha_collective_tma_warpspecialized.hpp)
ACCESS = 8                   # elements per 16-byte TMA row (f16 / bf16)
# head tile -> (BlockQ, BlockKV, head tile): the example's forward kernels (88_hopper_fmha.cu
# run_fwd_32 / 64 / 128 / 256, KernelCooperative)
TILES = {32: (128, 64, 32), 64: (128, 64, 64), 128: (128, 128, 128), 256: (128, 64, 256)}
MAX_HEAD_DIM = 256
_GRID_MAX = 65535            # grid y = batch, z = heads
_INT32_MAX = 2**31 - 1
_INT32_MAX = 2**31 - 1


def head_tile(head_dim: int) -> int:
    """The smallest of the example's head tiles (32, 64, 128, 256) holding ``head_dim``.
    Raises ValueError above 256."""
    for d in sorted(TILES):
        if head_dim <= d:
            return d
    raise ValueError(f"head dim {head_dim} exceeds the Hopper kernel's {MAX_HEAD_DIM}")


def refusal(problem: AttentionProblem, arch: str = ARCH) -> str | None:
    """Why the Hopper kernel cannot run ``problem`` (the region's kernel problem) on
    ``arch``, or None if it can. Sizes the runtime must check again (strides,
    alignment of each call's pointers) are checked by the emitted ``run``."""
    p = problem
    if arch != ARCH:
        return f"the Hopper attention kernel targets {ARCH}, not {arch!r}"
    if p.dtype not in DTYPES:
        return f"dtype {p.dtype}: the Hopper attention kernel takes {DTYPES}"
    if p.bias != "none":
        return "an additive bias / boolean mask: the Hopper attention kernel has no bias"
    if p.head_dim != p.head_dim_v:
        return (f"head_dim {p.head_dim} != head_dim_v {p.head_dim_v}: the Hopper kernel "
                f"has one head dim")
    if p.head_dim > MAX_HEAD_DIM or p.head_dim % ACCESS:
        return f"head dim {p.head_dim}: the Hopper kernel takes multiples of 8 up to {MAX_HEAD_DIM}"
    if p.align < ACCESS:
        return f"Q/K/V only {p.align}-element aligned: TMA needs 16-byte pointers and strides"
    if not (math.isfinite(p.scale) and p.scale > 0):
        return f"scale {p.scale!r}: the softmax takes its row max before scaling (needs scale > 0)"
    if p.seq_q is None or p.seq_kv is None:
        return "a dynamic sequence length: the Hopper kernel needs seq_q % 8 == 0 (checked statically)"
    if p.seq_q % ACCESS:
        return f"seq_q {p.seq_q} is not a multiple of 8 (the example's can_implement)"
    if p.seq_kv < 1 or max(p.seq_q, p.seq_kv) > _INT32_MAX:
        return f"seq_kv {p.seq_kv}: out of the kernel's range"
    if p.causal == "top_left" and p.seq_q > p.seq_kv:
        return (f"top-left causal with seq_q {p.seq_q} > seq_kv {p.seq_kv}: CausalFusion "
                f"would let the last rows see keys past seq_kv")
    if p.causal == "bottom_right" and p.seq_q != p.seq_kv:
        return "bottom-right causal with seq_q != seq_kv: CausalFusion is top-left"
    if p.heads > _GRID_MAX or (p.batch is not None and p.batch > _GRID_MAX):
        return f"more than {_GRID_MAX} heads or batches (grid z / y)"
    return None


def supports(problem: AttentionProblem, arch: str = ARCH) -> bool:
    """True if ``choose(problem, arch)`` returns a kernel."""
    return refusal(problem, arch) is None


def config_for(head_dim_tile: int) -> KernelConfig:
    """The KernelConfig of the Hopper kernel whose head tile is ``head_dim_tile``."""
    if head_dim_tile not in TILES:
        raise ValueError(f"head tile must be one of {tuple(TILES)}, got {head_dim_tile}")
    return KernelConfig(family=FAMILY, tile=TILES[head_dim_tile], stages=STAGES,
                        kernel_schedule=SCHEDULE)


def choose(problem: AttentionProblem, arch: str = ARCH) -> AttentionKernelSm90:
    """The Hopper kernel for ``problem``: the smallest head tile holding its head dim,
    the causal fusion for a causal mask. Raises ValueError with the reason when it
    cannot run it (``refusal``)."""
    reason = refusal(problem, arch)
    if reason:
        raise ValueError(reason)
    return AttentionKernelSm90(arch=arch, dtype=problem.dtype,
                               config=config_for(head_tile(problem.head_dim)),
                               causal=problem.causal != "none")


def workspace_bytes(batch: int, heads: int, seq_q: int) -> int:
    """What the emitted ``workspace_size`` returns for a supported call: the fp32
    log-sum-exp of every query row."""
    return batch * heads * seq_q * 4
