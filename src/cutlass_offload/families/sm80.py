"""CUTLASS 2.x tensor-core GEMMs and implicit-GEMM conv2d fprop (family
``cutlass2x_sm80``, ArchTag Sm80; also run on sm_90a): what compiles.

The rules (see emit/epilogue_sm80.py, emit/gemm_sm80.py and emit/conv_sm80.py for
why): f16 / bf16 take alignments 1/2/4/8 elements, f32 (TF32) 1/2/4; the
multistage (cp.async) mainloop needs >= 4-byte operand accesses, so 16-bit
align-1 operands get 2-stage (register-staged) configs only; the mainloop's
shared memory must fit in an sm_80 block. ``gemm_configs`` / ``conv_configs``
list the known-good configs largest tile first; ``choose_iterator`` picks the
conv activation iterator for C input channels.
"""
from __future__ import annotations

from ..dtypes import BYTES
from ..ir import CONV_ITERATORS, KernelConfig

FAMILY = "cutlass2x_sm80"
INSTRUCTION = {"f16": (16, 8, 16), "bf16": (16, 8, 16), "f32": (16, 8, 8)}
ALIGNMENTS = {"f16": (1, 2, 4, 8), "bf16": (1, 2, 4, 8), "f32": (1, 2, 4)}

# Largest opt-in dynamic shared memory per block on sm_80 (A100); H100 allows more.
SMEM_LIMIT = 163 * 1024


ITERATORS = {
    "optimized": "kOptimized",
    "analytic": "kAnalytic",
    "few_channels": "kFewChannels",
    "fixed_channels": "kFixedChannels",
}

# Below this many input channels a 32-wide K tile of the optimized/analytic
# iterators (one filter position per tile) is mostly padding; the few/fixed
# channels iterators pack several filter positions into one tile instead.
FEW_CHANNELS_BELOW = 16


def check_alignments(dtype: str, why: str = " (at most 16 bytes per access)", **aligns) -> None:
    """Raise ValueError for an unknown dtype or an alignment (elements) it does not allow."""
    if dtype not in ALIGNMENTS:
        raise ValueError(f"unsupported dtype {dtype!r}")
    allowed = ALIGNMENTS[dtype]
    for what, a in aligns.items():
        if a not in allowed:
            raise ValueError(f"{what}={a} is not legal for {dtype}: allowed {allowed}{why}")


def cp_async_ok(dtype: str, align_a: int, align_b: int) -> bool:
    """cp.async copies 4, 8 or 16 bytes: the multistage mainloop needs that much."""
    return min(align_a, align_b) * BYTES[dtype] >= 4


def check_warp_tiling(cfg: KernelConfig, dtype: str) -> None:
    """Instruction shape for the dtype, warp tiling of the threadblock, warp count."""
    if tuple(cfg.instruction) != INSTRUCTION[dtype]:
        raise ValueError(f"{dtype} needs instruction shape {INSTRUCTION[dtype]}, "
                         f"got {tuple(cfg.instruction)}")
    tm, tn, tk = cfg.tile
    wm, wn, wk = cfg.warp
    im, in_, ik = cfg.instruction
    if tm % wm or tn % wn or wk != tk:
        raise ValueError(f"warp {cfg.warp} must tile the threadblock {cfg.tile} in M and N "
                         f"and have the same K")
    if wm % im or wn % in_ or wk % ik:
        raise ValueError(f"warp {cfg.warp} must be a multiple of instruction {cfg.instruction}")
    warps = (tm // wm) * (tn // wn)
    if warps not in (1, 2, 4, 8):
        raise ValueError(f"{warps} warps per threadblock; use 1, 2, 4 or 8")
    # every thread must take part in each operand tile's global loads (at most 16
    # bytes, 8 16-bit elements, per access): CUTLASS's pitch-linear thread maps
    # static_assert a non-zero iteration count (transform/pitch_linear_thread_map.h)
    per_access = 16 // (2 if dtype != "f32" else 4)
    for what, rows in (("A", tm), ("B", tn)):
        if rows * tk // per_access < 32 * warps:
            raise ValueError(f"the {rows}x{tk} {what} tile has fewer 16-byte accesses than the "
                             f"{32 * warps} threads of {warps} warps")


def check_smem(cfg: KernelConfig, dtype: str) -> None:
    """The mainloop's shared memory must fit in what an sm_80 block may use."""
    tm, tn, tk = cfg.tile
    smem = cfg.stages * (tm + tn) * tk * BYTES[dtype]
    if smem > SMEM_LIMIT:
        raise ValueError(f"mainloop needs {smem} bytes of shared memory, more than the "
                         f"{SMEM_LIMIT} bytes an sm_80 block may use")


def config(tile, warp, stages, instruction) -> KernelConfig:
    return KernelConfig(family=FAMILY, tile=tile, warp=warp, stages=stages,
                        instruction=instruction)


def known_configs(dtype: str, align_a: int, align_b: int) -> list[KernelConfig]:
    """Up to 4 configs, largest tile first, for a checked dtype and operand alignment.

    Sub-4-byte operand accesses (16-bit types with align 1) get 2-stage
    (register-staged) configs only; TF32 gets stages >= 3 only.
    """
    inst = INSTRUCTION[dtype]
    if dtype == "f32":
        return [
            config((128, 128, 32), (64, 64, 32), 3, inst),
            config((128, 64, 32), (64, 32, 32), 3, inst),
            config((64, 64, 32), (32, 32, 32), 4, inst),
        ]
    if not cp_async_ok(dtype, align_a, align_b):
        return [
            config((128, 128, 32), (64, 64, 32), 2, inst),
            config((128, 64, 32), (64, 32, 32), 2, inst),
            config((64, 128, 32), (32, 64, 32), 2, inst),
            config((64, 64, 32), (32, 32, 32), 2, inst),
        ]
    return [
        config((128, 256, 32), (64, 64, 32), 3, inst),
        config((128, 128, 32), (64, 64, 32), 4, inst),
        config((128, 64, 32), (64, 32, 32), 4, inst),
        config((64, 64, 32), (32, 32, 32), 5, inst),
    ]


def gemm_configs(dtype: str, align_a: int, align_b: int, align_c: int) -> list[KernelConfig]:
    """Return up to 4 configs, largest tile first, that compile for this dtype/alignment.

    Raises ValueError if the dtype or an alignment is not supported at all.
    """
    check_alignments(dtype, "", align_a=align_a, align_b=align_b, align_c=align_c)
    return known_configs(dtype, align_a, align_b)


# Output channels up to which a conv gets tiles as narrow as its N (see conv_configs)
NARROW_N = 32


def narrow_configs(dtype: str, align_a: int, align_b: int, n: int) -> list[KernelConfig]:
    """Tiles 16 or 32 wide in N (the smallest that holds ``n`` output channels),
    128 and 64 rows, one 32-row warp tile per 32 rows: for a conv with few output
    channels (a VAE's 128 -> 3 output conv), where a 64- or 256-wide tile computes
    mostly zero columns (the 128 x 256 tile ran that conv at 0.22x cuDNN on an H200,
    benchmarks/results/kernels_2026-12-01_h200.log)."""
    inst = INSTRUCTION[dtype]
    tn = 16 if n <= 16 else 32
    stages = 3 if dtype == "f32" else (4 if cp_async_ok(dtype, align_a, align_b) else 2)
    # two warps either way: the (tn x 32) filter tile has 64 16-byte accesses at
    # tn = 16, one per thread of two warps (four warps leave the filter iterator's
    # thread map with zero iterations: pitch_linear_thread_map.h static_assert)
    return [config((128, tn, 32), (64, tn, 32), stages, inst),
            config((64, tn, 32), (32, tn, 32), stages, inst)]


def conv_configs(dtype: str, align_a: int, align_b: int, align_c: int,
                  iterator: str = "optimized", n: int | None = None) -> list[KernelConfig]:
    """Return up to 4 configs, largest tile first, legal for this dtype/alignment;
    with ``n`` (output channels) <= NARROW_N, the ``narrow_configs`` instead.

    Sub-4-byte operand accesses (16-bit types with align 1) get 2-stage configs
    only. The list does not depend on ``iterator`` (checked, for the caller's
    sake): every iterator accepts every config returned (tile K 32 is a
    multiple of any channel count fixed_channels takes). Raises ValueError if
    the dtype, an alignment or the iterator is not supported.
    """
    if iterator not in ITERATORS:
        raise ValueError(f"iterator must be one of {CONV_ITERATORS}, got {iterator!r}")
    check_alignments(dtype, align_a=align_a, align_b=align_b, align_c=align_c)
    if n is not None and n <= NARROW_N:
        return narrow_configs(dtype, align_a, align_b, n)
    return known_configs(dtype, align_a, align_b)


def choose_iterator(dtype: str, c: int, align_a: int) -> str:
    """The activation iterator algorithm for C input channels read ``align_a`` at a time.

    * C >= 16: "optimized" when an access is cp.async-able (>= 4 bytes), else
      "analytic" (e.g. f16 with odd C; it then runs with stages = 2).
    * C < 16: "fixed_channels" when C == align_a (C = 1, 2, 4, 8; one access is
      one filter position), else "few_channels" (C = 3, 9, ...); both pack
      several filter positions into one K tile instead of padding C to 32.

    The kernel also needs align_b == align_a for fixed_channels; ConvProblem
    derives both from C, so they are equal. Raises ValueError for an unknown
    dtype, an illegal alignment or a C the alignment does not divide.
    """
    check_alignments(dtype, align_a=align_a)
    if c < 1 or c % align_a:
        raise ValueError(f"align_a={align_a} must divide C={c}")
    if c < FEW_CHANNELS_BELOW:
        return "fixed_channels" if c == align_a else "few_channels"
    return "optimized" if align_a * BYTES[dtype] >= 4 else "analytic"
