"""The pure parts of benchmarks/runtime.py's per-region table (no GPU): the FLOPs
of a region from its problem object and output shape, the signature that groups
identical regions, a one-line shape summary, and the issue-6 GEMM target flags.

Region kinds: GemmRegion, ConvRegion, AttentionRegion, NormRegion and
GroupNormRegion from cutlass_offload.ir. Norms are memory-bound: no FLOPs (None);
runtime.py reports their bandwidth instead.
"""
from __future__ import annotations

import math

import torch

from cutlass_offload.ir import (
    AttentionRegion,
    ConvRegion,
    GemmRegion,
    GroupNormRegion,
    NormRegion,
)

# Issue 6 targets (H200, fp16): a GEMM region with M >= GEMM_LARGE_M rows must be at
# least as fast as the PyTorch ops it replaces; one with fewer rows within SMALL_M_SLACK.
GEMM_LARGE_M = 256
SMALL_M_SLACK = 1.2


def region_kind(region) -> str:
    """'gemm', 'conv2d', 'attention', 'norm' or 'group_norm'. Raises TypeError."""
    for cls, kind in ((GemmRegion, "gemm"), (ConvRegion, "conv2d"), (AttentionRegion, "attention"),
                      (NormRegion, "norm"), (GroupNormRegion, "group_norm")):
        if isinstance(region, cls):
            return kind
    raise TypeError(f"not a region: {type(region).__name__}")


def visible_pairs(seq_q: int, seq_kv: int, causal: str) -> int:
    """(query, key) pairs an attention computes: seq_q * seq_kv, or under a causal
    mask only the visible ones (ir.AttentionProblem's top_left: key j <= query i;
    bottom_right: j <= i + seq_kv - seq_q), the blocks the kernel skips not counted."""
    if causal == "none":
        return seq_q * seq_kv
    shift = 0 if causal == "top_left" else seq_kv - seq_q
    return sum(min(seq_kv, max(0, i + shift + 1)) for i in range(seq_q))


def gemm_rows(region: GemmRegion, out_shape) -> tuple:
    """(L, M) of a GEMM region's call from its output shape (..., N): batch folded
    into M ("fold") gives L = 1, M = all leading dims; batched forms (L, ..., M, N)."""
    lead = tuple(out_shape[:-1])
    if region.batch_mode == "fold":
        return 1, math.prod(lead)
    return math.prod(lead[:-1]), lead[-1]


def attention_dims(region: AttentionRegion, out_shape, seq_kv: int) -> tuple:
    """(B * H, seq_q, seq_kv) of an attention call: the output holds B * H * seq_q
    rows of head_dim_v ((B, L, H, Ev) for out_layout "bmhk", else (..., L, Ev))."""
    dv = region.problem.head_dim_v
    rows = math.prod(out_shape) // dv
    seq_q = out_shape[1] if region.out_layout == "bmhk" else out_shape[-2]
    return rows // seq_q, seq_q, seq_kv


def region_flops(region, out_shape, seq_kv: int | None = None) -> float | None:
    """Floating-point operations of one call (multiply and add counted as 2).

    GEMM: 2 * L * M * N * K (= 2 * output elements * K, twice that under a GLU epilogue,
      whose output has N / 2 columns); epilogues not counted.
    conv2d fprop: 2 * N * P * Q * K * C * R * S (= 2 * output elements * C * R * S).
    attention: 2 * B * H * pairs * (head_dim + head_dim_v), pairs = visible (query,
      key) pairs (``visible_pairs``; = 4 * B * H * Sq * Skv * D without a mask and
      with equal head dims, the FlashAttention papers' count). ``seq_kv`` is the
      call's key length (the problem's when static).
    norm / group_norm: None (memory-bound; no FLOP rate to compare).
    out_shape: the region output's shape for this call (dynamic sizes come from it).
    Raises ValueError for an attention call without a known seq_kv.
    """
    kind = region_kind(region)
    numel = math.prod(out_shape)
    p = region.problem
    if kind == "gemm":
        return 2.0 * numel * p.k * (2 if p.epilogue.glu else 1)
    if kind == "conv2d":
        return 2.0 * numel * p.c * p.r * p.s
    if kind == "attention":
        seq_kv = p.seq_kv if seq_kv is None else seq_kv
        if seq_kv is None:
            raise ValueError(f"{region.name}: attention FLOPs need the call's seq_kv (dynamic)")
        bh, sq, skv = attention_dims(region, out_shape, seq_kv)
        return 2.0 * bh * visible_pairs(sq, skv, p.causal) * (p.head_dim + p.head_dim_v)
    return None


def gemm_m(region, out_shape) -> int | None:
    """The GEMM M the issue-6 target is stated in: rows of a GEMM region (per batch
    entry), N * P * Q of a conv's implicit GEMM; None for other kinds."""
    kind = region_kind(region)
    if kind == "gemm":
        return gemm_rows(region, out_shape)[1]
    if kind == "conv2d":
        return math.prod(out_shape) // region.problem.k
    return None


def _tensor_sig(x):
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), tuple(x.stride()), str(x.dtype))
    return repr(x)


def region_signature(region, inputs, kernel_name: str | None = None) -> tuple:
    """Hashable identity of a region call: kind, form, problem (a frozen dataclass),
    the kernel (None: the PyTorch side, same for every kernel choice) and each
    input's shape, stride and dtype. Regions with equal signatures compute the same
    problem on the same layouts: one timing stands for all of them."""
    return (region_kind(region), region.form, region.problem, kernel_name,
            tuple(_tensor_sig(x) for x in inputs))


def group_by_signature(items) -> list:
    """[(signature, [payload, ...]), ...] in first-seen order from (signature,
    payload) pairs: the count of a group is len of its list."""
    groups = {}
    for sig, payload in items:
        groups.setdefault(sig, []).append(payload)
    return list(groups.items())


def describe(region, out_shape, seq_kv: int | None = None) -> str:
    """One-line shape summary of a call, e.g. 'M1024 N3072 K768' or
    'N8 64x56x56 -> 256 k1x1 s1'."""
    kind = region_kind(region)
    p = region.problem
    if kind == "gemm":
        lb, m = gemm_rows(region, out_shape)
        return (f"L{lb} " if lb > 1 else "") + f"M{m} N{p.n} K{p.k}"
    if kind == "conv2d":
        n = out_shape[0]
        stride = "x".join(map(str, p.stride)) if p.stride[0] != p.stride[1] else str(p.stride[0])
        return f"N{n} {p.c}x{p.h}x{p.w} -> {p.k} k{p.r}x{p.s} s{stride}"
    if kind == "attention":
        seq_kv = p.seq_kv if seq_kv is None else seq_kv
        bh, sq, skv = attention_dims(region, out_shape, seq_kv or 0)
        mask = "" if p.causal == "none" else f" {p.causal}"
        return f"BH{bh} Sq{sq} Skv{skv} D{p.head_dim}" + ("" if p.head_dim_v == p.head_dim else f"/{p.head_dim_v}") + mask
    if kind == "norm":
        return f"{p.kind} {math.prod(out_shape) // p.cols}x{p.cols}"
    silu = "+silu" if p.silu else ""
    return f"N{out_shape[0]} C{p.c} {p.h}x{p.w} G{p.groups}{silu}"


def target_flag(kind: str, m: int | None, ours_us: float, torch_us: float) -> str:
    """'MISS' where a GEMM region misses the issue-6 target (slower than PyTorch for
    M >= GEMM_LARGE_M, more than SMALL_M_SLACK x slower below), 'ok' where it meets
    it; for other kinds (no target stated) 'slower' when ours takes longer, else ''.
    Raises ValueError for a GEMM without M or a non-positive time."""
    if not (ours_us > 0 and torch_us > 0):
        raise ValueError(f"times must be positive, got ours {ours_us} us, PyTorch {torch_us} us")
    if kind == "gemm":
        if m is None:
            raise ValueError("a GEMM target needs M")
        limit = torch_us if m >= GEMM_LARGE_M else SMALL_M_SLACK * torch_us
        return "MISS" if ours_us > limit else "ok"
    return "slower" if ours_us > torch_us else ""


def time_lost_us(row: dict) -> float:
    """Device microseconds per forward the offload loses on this group against
    PyTorch (negative: gains): count * (ours - PyTorch). Worst offenders first
    when sorted by it, descending."""
    return row["count"] * (row["ours_us"] - row["pytorch_us"])
