"""Conv2d fprop lowered onto the sm90a GEMM (family ``cutlass3x_sm90``, conv kernels
with ``iterator`` "direct" or "im2col"): which problems take it, and the GEMM each
one runs (emit/conv_gemm_sm90.py writes the C++).

Two lowerings, both NHWC x KRSC -> NPQK, so the GEMM's row-major (M, N) output
*is* the conv's output and the epilogue (bias per column, full residual as the
source C) is the GEMM's own:

* ``direct``: a 1x1, stride-1, unpadded conv is a GEMM as it stands:
  A = x as (N*H*W, C), B = the filter as (K, C) (K-major, a Linear weight's
  layout), D = y as (N*H*W, K). It gets the GEMM family's whole machinery
  (ping-pong and cooperative persistent kernels, the learned table, PDL), which
  the one non-persistent sm90 conv schedule of CUTLASS 4.2 lacks: on the H200
  EfficientNet-B0's 1x1 convs ran at 0.35-0.6x cuDNN as TMA implicit GEMMs
  (benchmarks/results/kernels_2026-12-01_h200.log).
* ``im2col``: a conv with few input channels (an RGB stem, C = 3; a latent
  conv_in, C = 4). The TMA implicit GEMM tiles K = (C, S, R) one filter position
  at a time with C zero-filled to the 64-wide K tile: C = 3 padded to 8 does 8x
  the MMA work and ran the ResNet-50 stem in 239 us against cuDNN's 45. Here a
  small pack kernel (templates/im2col.cuh) writes the (M, Kp) im2col matrix,
  Kp = R*S*C rounded up to 8 (16-byte rows for TMA), and the (K, Kp) filter with
  zero columns past R*S*C, into the workspace (the filter is B as it lies when
  R*S*C is a multiple of 8); the GEMM then runs on them.
  Exact zeros stand for padding and the K round-up, so no input value reaches an
  output outside its window (unlike CUTLASS 2.x's few/fixed-channels iterators,
  see emit/conv_sm80.py). The matrix is built in row chunks of at most
  ``IM2COL_CHUNK_BYTES``, so the workspace stays bounded at any batch.
  The same lowering serves convs with few output pixels and a deep K (the SD UNet's
  8 x 8 x 2560 -> 1280 3x3 at batch 2: 40 tiles of 64 x 64 for 132 SMs as a TMA conv,
  none of whose schedules splits K): its GEMM can split K. The learned conv table
  picks it there from a measured search (select/conv.py), not this module's rule.
"""
from __future__ import annotations

from ..dtypes import BYTES
from ..ir import ConvProblem, GemmProblem

ITERATORS = ("direct", "im2col")

# im2col for C below this: the TMA implicit GEMM wastes >= 8/C of its K tile there,
# and the im2col matrix (R*S*C per output pixel) stays small next to the output.
IM2COL_MAX_C = 8
# Largest im2col matrix the pack kernel writes at once (bytes); bigger problems run
# in row chunks, one pack + one GEMM each. 64 MiB: a 7x7 RGB stem at batch 16.
IM2COL_CHUNK_BYTES = 64 << 20
# A chunk is a multiple of this many rows (the largest GEMM tile M).
CHUNK_ROW_MULTIPLE = 256


def _common_ok(problem: ConvProblem) -> bool:
    return (problem.dtype in ("f16", "bf16") and not problem.tf32 and problem.k % 8 == 0
            and problem.align_c == 8 and not problem.epilogue.residual_broadcast)


def direct_ok(problem: ConvProblem) -> bool:
    """A 1x1, stride-1, unpadded conv with C and K multiples of 8 (f16/bf16, no
    per-channel residual): the activation is the GEMM's A as it lies."""
    return (_common_ok(problem) and problem.r == 1 and problem.s == 1
            and tuple(problem.stride) == (1, 1) and tuple(problem.pad) == (0, 0, 0, 0)
            and problem.pad_c == 0 and problem.c % 8 == 0 and problem.align_a == 8
            and problem.align_b == 8)


def im2col_ok(problem: ConvProblem) -> bool:
    """A conv with a spatial filter (R*S > 1) and C < IM2COL_MAX_C input channels
    (not zero-padded), K a multiple of 8, f16/bf16, no per-channel residual: the
    im2col lowering's rule. A 1x1 conv with so few channels (a squeeze-excite
    expansion, 32 x 4 -> 96) gains nothing from it: the pack is then a second launch
    around a copy (9.0 us against 6.7 as the TMA conv on 8 padded channels, H200)."""
    return im2col_feasible(problem) and problem.c < IM2COL_MAX_C


def im2col_feasible(problem: ConvProblem) -> bool:
    """Whether the im2col lowering can run ``problem`` at all (the search and the
    learned conv table may pick it beyond ``im2col_ok``'s rule): f16/bf16, K a
    multiple of 8, no per-channel residual, C not zero-padded, a spatial filter.
    With R*S*C a multiple of 8 the filter is the GEMM's B as it lies (no copy)."""
    return _common_ok(problem) and problem.pad_c == 0 and problem.r * problem.s > 1


def iterator_for(problem: ConvProblem) -> str:
    """"direct", "im2col", or "" when neither lowering is the rule for ``problem``."""
    if direct_ok(problem):
        return "direct"
    if im2col_ok(problem):
        return "im2col"
    return ""


def packed_k(problem: ConvProblem) -> int:
    """Kp: the im2col matrix's row length, R*S*C rounded up to 8 elements."""
    return -(-problem.r * problem.s * problem.c // 8) * 8


def gemm_problem(problem: ConvProblem, iterator: str) -> GemmProblem:
    """The GEMM the conv runs (for tile choice): M = N*P*Q output pixels, N = K
    output channels, K = C (direct) or Kp (im2col), B K-major, same epilogue. An
    im2col GEMM's M is at most one chunk's rows."""
    if iterator not in ITERATORS:
        raise ValueError(f"iterator must be one of {ITERATORS}, got {iterator!r}")
    k = problem.c if iterator == "direct" else packed_k(problem)
    pixels = problem.p * problem.q
    m = None if problem.n is None else problem.n * pixels
    m_hint = problem.n_hint * pixels
    if iterator == "im2col":
        rows = chunk_rows(k, problem.dtype)
        m = None if m is None else min(m, rows)
        m_hint = min(m_hint, rows)
    return GemmProblem(n=problem.k, k=k, dtype=problem.dtype, layout_b="col", align_a=8,
                       align_b=8, align_c=8, epilogue=problem.epilogue, m=m, m_hint=m_hint)


def chunk_rows(kp: int, dtype: str) -> int:
    """Rows of the im2col matrix packed at once (mirror of the C++ ``chunk_rows``)."""
    rows = IM2COL_CHUNK_BYTES // (kp * BYTES[dtype])
    return max(CHUNK_ROW_MULTIPLE, rows // CHUNK_ROW_MULTIPLE * CHUNK_ROW_MULTIPLE)
