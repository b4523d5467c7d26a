"""CUTLASS's sm80 fused multi-head attention forward (examples/41, family
``cutlass2x_sm80``; runs on sm_80 and sm_90a) and the choice between it and the
Hopper kernel (families/attention_sm90.py): which problems run, with which tile.
emit/attention.py writes the C++ and explains the kernel's limits.
"""
from __future__ import annotations

import math
from typing import Optional

from ..dtypes import BYTES
from ..ir import (ATTENTION_ALIGNED_ACCESS, ATTENTION_BIASES, ATTENTION_DTYPES, ATTENTION_LAYOUTS,
                  ATTENTION_UNALIGNED_ACCESS, AttentionKernel, AttentionProblem, KernelConfig)
from ..ir.common import _check
from . import attention_sm90

FAMILY = "cutlass2x_sm80"
ARCHS = ("sm80", "sm90a")
DTYPES = ATTENTION_DTYPES
BIASES = ATTENTION_BIASES
LAYOUTS = ATTENTION_LAYOUTS

# Q/K/V access width in elements: aligned kernel (16 bytes) / not aligned (kMinimumAlignment).
_ALIGNED_ACCESS = ATTENTION_ALIGNED_ACCESS
_UNALIGNED_ACCESS = ATTENTION_UNALIGNED_ACCESS
# (kQueriesPerBlock, kKeysPerBlock, kMaxK), PyTorch's sm80 forward kernels.
TILES = ((64, 64, 64), (64, 128, 128), (32, 128, 65536))
MAX_HEAD_DIM = 65536
_GRID_MAX = 65535


def config_for(dtype: str, tile: tuple) -> KernelConfig:
    """The KernelConfig describing AttentionKernel tile ``tile`` for ``dtype``."""
    _check(dtype, DTYPES, "dtype")
    _check(tuple(tile), TILES, "attention tile (kQueriesPerBlock, kKeysPerBlock, kMaxK)")
    return KernelConfig(family=FAMILY, tile=tuple(tile), warp=(32, 32, 32),
                        instruction=(16, 8, 8), stages=4 if BYTES[dtype] == 2 else 3)


def _tile_for(max_head_dim: int) -> tuple:
    for tile in TILES:
        if max_head_dim <= tile[2]:
            return tile
    raise ValueError(f"head dim {max_head_dim} exceeds {MAX_HEAD_DIM}")


def refusal(problem: AttentionProblem, arch: str = "sm80") -> Optional[str]:
    """Why no AttentionKernel can run ``problem`` on ``arch``, or None if one can."""
    if arch not in ARCHS:
        return f"attention kernels target {ARCHS}, not {arch!r}"
    p = problem
    if not (math.isfinite(p.scale) and p.scale > 0):
        return (f"scale {p.scale!r}: the kernel takes only finite scales > 0 (its row max "
                f"ignores -0.0 logits, so a zero query row with scale <= 0 gives NaN); "
                f"for a negative scale negate Q and pass -scale")
    for what, d in (("head_dim", p.head_dim), ("head_dim_v", p.head_dim_v)):
        if d > MAX_HEAD_DIM:
            return f"{what}={d} exceeds the kernel's kMaxK bound {MAX_HEAD_DIM}"
        if d % _UNALIGNED_ACCESS:
            return (f"{what}={d} is not a multiple of 4: even the not-aligned kernel moves "
                    f"Q/K/V/output in 4-element vectors predicated on their first element, "
                    f"so a partial vector would read or write past the head; pad the head "
                    f"dim to a multiple of 8 (as PyTorch's SDPA does)")
    if p.align < _UNALIGNED_ACCESS:
        return (f"Q/K/V pointers or strides are only {p.align}-element aligned; the kernel "
                f"needs multiples of 4 elements")
    if p.batch is not None and p.batch > _GRID_MAX:
        return f"batch {p.batch} exceeds the grid's z limit {_GRID_MAX}"
    if p.heads > _GRID_MAX:
        return f"{p.heads} heads exceed the grid's y limit {_GRID_MAX}"
    for what, n in (("seq_q", p.seq_q), ("seq_kv", p.seq_kv)):
        if n is not None and n > 2**31 - 1:
            return f"{what}={n} does not fit the kernel's int32 sizes"
    if p.seq_kv == 0 and (p.seq_q or 0) > 0:
        return "seq_kv = 0: softmax over no keys"
    if p.softcap and (arch != "sm90a" or not attention_sm90.supports(p, arch)):
        why = attention_sm90.refusal(p, "sm90a") if arch == "sm90a" else f"the target is {arch}"
        return (f"a tanh soft-cap on the logits: only the Hopper kernel (sm_90a) applies it, "
                f"and it cannot run this problem ({why})")
    if p.window and (arch != "sm90a" or not attention_sm90.supports(p, arch)):
        # partition folds a window only for an sm_90a target; kept as a mask elsewhere
        why = attention_sm90.refusal(p, "sm90a") if arch == "sm90a" else f"the target is {arch}"
        return (f"a sliding-window mask of {p.window} keys: only the Hopper kernel (sm_90a) "
                f"applies it, and it cannot run this problem ({why})")
    if p.causal == "bottom_right" and p.seq_q is not None and p.seq_kv is not None \
            and p.seq_q > p.seq_kv:
        return (f"bottom-right causal with seq_q={p.seq_q} > seq_kv={p.seq_kv}: the first "
                f"rows see no key (the kernel computes seq_kv - seq_q in uint32)")
    return None


def supports(problem: AttentionProblem, arch: str = "sm80") -> bool:
    """True if ``choose(problem, arch)`` returns a kernel."""
    return refusal(problem, arch) is None


def choose(problem: AttentionProblem, arch: str = "sm80", config: KernelConfig | None = None):
    """The kernel for ``problem`` on ``arch``: on sm90a the Hopper kernel
    (``attention_sm90.choose``, an AttentionKernelSm90) when it supports the problem;
    otherwise the AttentionKernel (PyTorch's sm80 dispatch order: the first of 64x64
    k64, 64x128 k128, 32x128 k65536 whose kMaxK covers both head dims), aligned when
    the head dims and ``problem.align`` allow 16-byte accesses (f32: always), not
    aligned (4 elements) otherwise. Raises ValueError with the reason when no kernel
    can run it (see ``refusal``). ``config``: a Hopper config to use instead of the
    learned choice (attention_sm90.choose; ignored when the Hopper kernel cannot run
    the problem)."""
    reason = refusal(problem, arch)
    if reason:
        raise ValueError(reason)
    if arch == "sm90a" and attention_sm90.supports(problem, arch):
        return attention_sm90.choose(problem, arch, config)
    tile = _tile_for(max(problem.head_dim, problem.head_dim_v))
    wide = _ALIGNED_ACCESS[problem.dtype]
    aligned = (problem.dtype == "f32" or
               (problem.align >= wide and problem.head_dim % wide == 0
                and problem.head_dim_v % wide == 0))
    return AttentionKernel(arch=arch, dtype=problem.dtype, config=config_for(problem.dtype, tile),
                           aligned=aligned, supports_bias=problem.bias != "none",
                           kv_group=problem.kv_group)


def workspace_bytes(kernel, batch: int, heads: int, seq_q: int, head_dim_v: int) -> int:
    """What the emitted ``workspace_size`` returns for a supported call (0 for "rf"
    kernels and f32): the fp32 output accumulator, packed BMHK; for a Hopper kernel
    the fp32 log-sum-exp rows (``attention_sm90.workspace_bytes``)."""
    if kernel.config.family == attention_sm90.FAMILY:
        return attention_sm90.workspace_bytes(batch, heads, seq_q)
    return batch * seq_q * heads * head_dim_v * 4 if kernel.needs_workspace else 0
