"""CUTLASS's Hopper fused multi-head attention forward (examples/88_hopper_fmha,
family ``cutlass3x_sm90``): which problems it runs and with which head tile
(emit/attention_sm90.py writes the C++ and explains the kernel's limits).
"""
from __future__ import annotations

import math

from ..ir import AttentionKernelSm90, AttentionProblem, KernelConfig
from . import attention_sm90_table

FAMILY = "cutlass3x_sm90"
ARCH = "sm90a"
DTYPES = ("f16", "bf16")
COOPERATIVE = "KernelTmaWarpSpecializedCooperative"
# FmhaBuilder maps ping-pong to the cooperative kernel, persistent, with Q loaded by
# its own pipeline (fmha_kernel_builder.hpp): the FlashAttention-3 ping-pong.
PINGPONG = "KernelTmaWarpSpecializedPingpong"
SCHEDULE = COOPERATIVE       # the example's forward default
SCHEDULE_TAGS = {COOPERATIVE: "coop", PINGPONG: "pingpong"}
STAGES = 5                   # kStagesKV default (fmha_collective_tma_warpspecialized.hpp)
# Tile orders: the example's schedulers (query tile fastest), and for causal problems
# heaviest query tiles first (emit/templates/fmha_lpt_scheduler.h)
TILE_ORDERS = ("persistent", "lpt")
# The order a causal problem of more than one query tile gets without a learned row:
# heaviest first ran LLaMA's 512-token prefill (b4 h32 d64) in 27.4 / 22.6 us against
# 31.0 / 31.6 us in the example's order (cooperative / ping-pong, BlockKV 64; H200,
# benchmarks/results/kernels_attention_lpt_2026-12-02_h200.json); with one query
# tile both orders launch the same CTAs
CAUSAL_DEFAULT_ORDER = "lpt"
ACCESS = 8                   # elements per 16-byte TMA row (f16 / bf16)
BLOCK_Q = 128                # two consumer warpgroups of 64 query rows
# Queries per CTA: 64 per consumer warpgroup (the example's kNumMmaWarpGroups option,
# 2 by default, up to 4 roles in fmha_kernel_tma_warpspecialized.hpp). Three (192
# queries, 512 threads, 160 registers per consumer thread) is FlashAttention-3's tile
# for small head dims; offered for head tiles up to SMALL_HEAD (its S and O
# accumulators fit those registers)
BLOCK_QS = (128, 192)
SMALL_HEAD = 64
# Shared memory: Q (BlockQ x head) plus kStagesKV K-or-V tiles (K and V share the
# stages: the mainloop's SharedStorage union), 2-byte elements; the H100 / H200
# opt-in limit is 227 KiB (CUDA C++ Programming Guide, compute capability 9.0 table).
SMEM_LIMIT = 227 * 1024
# Head tiles: the example's 32 / 64 / 128 / 256 (88_hopper_fmha.cu run_fwd_*) and the
# exact fits of head dims 40 / 80 / 160 (48, 80, 160; 96 for 96): QK^T takes the head
# as its K extent, a multiple of 16 for 16-bit wgmma; PV takes it as N.
HEAD_TILES = (32, 48, 64, 80, 96, 128, 160, 256)
# Every config runs on an H200 against a float64 reference (tests/gpu/
# test_attention_sm90.py::test_every_config_matches_reference). With no learned row,
# a problem gets the example's head tiles: the exact fits are not always faster (the
# search picked the 64-wide ping-pong over the 48 tile for head dim 40), the table
# says where they are (head dim 160).
DEFAULT_HEAD_TILES = (32, 64, 128, 256)
# Ping-pong (the persistent kernel, Q on its own pipeline) for the head tiles the
# example runs it on (64, 128) and the exact fits of the UNet's head dims 40 / 80
# (48, 80: they compile and pass the float64 check of tests/gpu/test_attention_sm90.py)
PINGPONG_HEADS = (48, 64, 80, 128)
MAX_HEAD_DIM = 256
_GRID_MAX = 65535            # grid y = batch, z = heads
_INT32_MAX = 2**31 - 1


def smem_bytes(block_kv: int, head: int, stages: int = STAGES, schedule: str = COOPERATIVE,
               block_q: int = BLOCK_Q) -> int:
    """Shared memory of the kernel's tiles in bytes (f16 / bf16): Q (BlockQ x head) and
    ``stages`` K-or-V tiles (K and V share the stages: the mainloop's SharedStorage
    union); the persistent ping-pong kernel also keeps each warpgroup's 64 x head
    output tile apart (fmha_kernel_tma_warpspecialized.hpp TensorStorageStruct),
    the cooperative one reuses the mainloop's. Barriers not counted."""
    tiles = 2 * (block_q * head + stages * block_kv * head)
    return tiles + (2 * block_q * head if schedule == PINGPONG else 0)


def _configs() -> tuple:
    """Every legal (BlockQ, BlockKV, head) x schedule x tile order: BlockKV 64 or 128,
    five K/V stages (four where five do not fit), ping-pong for PINGPONG_HEADS;
    each in the example's tile order ("persistent")
    and, for causal problems only, heaviest query tiles first ("lpt")."""
    out = []
    room = SMEM_LIMIT - 2 * 1024            # the pipelines' barriers
    for block_q in BLOCK_QS:
        for order in TILE_ORDERS:
            for head in HEAD_TILES:
                if block_q != BLOCK_Q and head > SMALL_HEAD:
                    continue
                for block_kv in (64, 128):
                    for schedule in (COOPERATIVE, PINGPONG):
                        if schedule == PINGPONG and head not in PINGPONG_HEADS:
                            continue
                        stages = next((s for s in (STAGES, 4) if smem_bytes(
                            block_kv, head, s, schedule, block_q) <= room), None)
                        if stages is not None:
                            out.append(KernelConfig(
                                family=FAMILY, tile=(block_q, block_kv, head), stages=stages,
                                kernel_schedule=schedule, tile_scheduler=order))
    return tuple(out)


def legal_for(config: KernelConfig, causal: bool) -> bool:
    """Whether ``config``'s tile order serves a problem with (or without) a causal mask:
    "lpt" orders tiles by their causal work and is for causal problems only."""
    return causal or config.tile_scheduler != "lpt"


CONFIGS = _configs()
# The example's forward instantiation per head tile (88_hopper_fmha.cu run_fwd_32 / 64 /
# 128 / 256, KernelCooperative): the choice when the learned table has no row.
DEFAULT_BLOCK_KV = {32: 64, 48: 64, 64: 64, 80: 128, 96: 128, 128: 128, 160: 64, 256: 64}


def head_tile(head_dim: int, defaults_only: bool = True) -> int:
    """The smallest head tile holding ``head_dim`` (of DEFAULT_HEAD_TILES, or of
    HEAD_TILES). Raises ValueError above 256."""
    for d in (DEFAULT_HEAD_TILES if defaults_only else HEAD_TILES):
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
    # seq_q needs no multiple of 8 (the example's can_implement asks for one): Q is
    # read by TMA, zero-filled past seq_q; O's TMA store clips the last tile's rows
    # and the log-sum-exp store is predicated on seq_q (fmha_epilogue.hpp).
    if p.seq_q is None or p.seq_kv is None:
        return "a dynamic sequence length: the choice of tile and mask is made per static shape"
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


def config_for(head_dim_tile: int, block_kv: int | None = None,
               schedule: str = COOPERATIVE, order: str = "persistent",
               block_q: int = BLOCK_Q) -> KernelConfig:
    """The KernelConfig of the Hopper kernel with head tile ``head_dim_tile``, keys per
    mainloop step ``block_kv`` (default: the example's, DEFAULT_BLOCK_KV),
    ``schedule`` (COOPERATIVE or PINGPONG), tile ``order`` (TILE_ORDERS) and queries
    per CTA ``block_q`` (BLOCK_QS). Raises ValueError for a config not in CONFIGS."""
    if head_dim_tile not in HEAD_TILES:
        raise ValueError(f"head tile must be one of {HEAD_TILES}, got {head_dim_tile}")
    block_kv = block_kv or DEFAULT_BLOCK_KV[head_dim_tile]
    for c in CONFIGS:
        if (c.tile == (block_q, block_kv, head_dim_tile) and c.kernel_schedule == schedule
                and c.tile_scheduler == order):
            return c
    raise ValueError(f"no Hopper attention config {block_q}x{block_kv}x{head_dim_tile} "
                     f"{schedule} {order}; legal: "
                     f"{sorted({(c.tile, c.kernel_schedule) for c in CONFIGS})} x {TILE_ORDERS}")


def candidates(problem: AttentionProblem, defaults_only: bool = True) -> tuple:
    """The configs that can run ``problem`` (legal, head tile >= its head dim), the
    smallest head tile that holds it first; what a search times (benchmarks/kernels_bench.py)."""
    heads = DEFAULT_HEAD_TILES if defaults_only else HEAD_TILES
    causal = problem.causal != "none"
    fits = [c for c in CONFIGS if c.tile[2] in heads and c.tile[2] >= problem.head_dim
            and legal_for(c, causal)]
    smallest = min(c.tile[2] for c in fits)
    return tuple(sorted(fits, key=lambda c: (c.tile[2] != smallest, c.tile[2], c.tile[0],
                                             c.tile[1], c.kernel_schedule != COOPERATIVE,
                                             TILE_ORDERS.index(c.tile_scheduler))))


def choose(problem: AttentionProblem, arch: str = ARCH,
           config: KernelConfig | None = None) -> AttentionKernelSm90:
    """The Hopper kernel for ``problem``: ``config`` when given (a profiled winner;
    ValueError unless it is in CONFIGS and holds the head dim), else the learned
    table's row for the problem (families/attention_sm90_table.py), else the example's
    instantiation for the smallest verified head tile; the causal fusion for a
    causal mask, with the problem's soft-cap and scale, its K/V head grouping and its
    sliding window compiled in. Raises ValueError with the reason when it cannot run it
    (``refusal``)."""
    reason = refusal(problem, arch)
    if reason:
        raise ValueError(reason)
    causal = problem.causal != "none"
    if config is None:
        config = learned_choice(problem) or default_config(problem)
    elif config not in CONFIGS or config.tile[2] < problem.head_dim:
        raise ValueError(f"{config} cannot run head dim {problem.head_dim} (legal: CONFIGS)")
    elif not legal_for(config, causal):
        raise ValueError(f"{config}: the lpt tile order is for causal problems")
    softcap = problem.softcap
    return AttentionKernelSm90(arch=arch, dtype=problem.dtype, config=config, causal=causal,
                               softcap=softcap, scale=problem.scale if softcap else 0.0,
                               kv_group=problem.kv_group, window=problem.window)


def default_config(problem: AttentionProblem) -> KernelConfig:
    """The choice for a problem with no learned row: the example's instantiation for
    the smallest head tile holding the head dim, in CAUSAL_DEFAULT_ORDER when causal
    with more than one query tile."""
    causal = problem.causal != "none" and problem.seq_q > BLOCK_Q
    order = CAUSAL_DEFAULT_ORDER if causal else "persistent"
    return config_for(head_tile(problem.head_dim), order=order)


def learned_choice(problem: AttentionProblem) -> KernelConfig | None:
    """The config the H200 corpus search found fastest for ``problem``'s class (head
    dim, causal, sequence lengths; families/attention_sm90_table.py), or None."""
    row = attention_sm90_table.lookup(problem.head_dim, problem.causal != "none", problem.seq_q,
                                      problem.seq_kv)
    if row is None:
        return None
    return config_for(*row)


def workspace_bytes(batch: int, heads: int, seq_q: int) -> int:
    """What the emitted ``workspace_size`` returns for a supported call: the fp32
    log-sum-exp of every query row."""
    return batch * heads * seq_q * 4


def learned_configs() -> list:
    """The distinct configs of the learned table's rows (families/attention_sm90_table.py)."""
    return list(dict.fromkeys(config_for(*row) for row in attention_sm90_table.rows().values()))


def search_space(problem: AttentionProblem) -> tuple:
    """The configs a search times for ``problem`` (benchmarks/kernels_bench.py): those of
    the smallest head tile holding its head dim (of all HEAD_TILES; the next one
    too when that is not an exact fit) and the default choice's; the default first."""
    default = default_config(problem)
    fits = candidates(problem, defaults_only=False)
    heads = sorted({c.tile[2] for c in fits})
    heads = heads[:1] if heads[0] == problem.head_dim else heads[:2]
    rest = [c for c in fits if c.tile[2] in heads and c != default]
    return (default, *rest)
