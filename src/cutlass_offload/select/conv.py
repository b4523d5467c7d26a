"""Conv2d fprop kernel choice: a depthwise conv gets the direct depthwise kernel
(families/depthwise.py), a grouped conv CUTLASS 2.x's grouped kernel
(families/grouped_conv.py); otherwise, on sm90a a conv lowered onto the sm90 GEMM where
its rule applies (1x1 stride-1 convs, and convs with C < 8 through an explicit
im2col: families/conv_gemm_sm90.py), else the TMA implicit GEMM where it applies,
else 2.x.

The implicit GEMM is M = N * P * Q, N = K, K = R * S * C (ir.ConvProblem). On
sm90a a problem the learned conv table lists (families/conv_sm90_table.py, from a
search of ``search_space`` on the GPU) gets the measured winner; otherwise the TMA
tile is the one with the least whole waves of CTAs x tile area / tile throughput
(families/conv_sm90.CANDIDATES, ``_sm90_config``).

A conv whose C is not a multiple of 8 cannot use TMA on x (16-byte channel
strides). Below 8 channels (an RGB stem, C = 3; the SD UNet's conv_in, C = 4) it
takes the im2col lowering; from 9 to 63 channels ``pad_channels`` gives it
C' = roundup(C, 8) zero-padded channels so that it runs the TMA kernel instead
of a 2.x alignment-1/2/4 kernel (the ResNet-50 stem: 965 us in the 2.x analytic
kernel vs 45 us in cuDNN on an H200, benchmarks/runtime.py; 239 us as a TMA
kernel on 8 padded channels, whose 64-wide K tile is then mostly zeros).
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..dtypes import BYTES
from ..families import conv_gemm_sm90, conv_sm90, conv_sm90_table, depthwise, grouped_conv, sm80
from ..ir import ConvChoice, ConvKernel, ConvProblem, ConvRegion, GemmLaunch, KernelConfig, note_not_fused
from . import sm90

# Pad C to a multiple of 8 only below this many channels. There the per-call
# input copy (N*H*W*(C + C') elements moved) is small next to the conv, and the
# 2.x kernels a small C gets are the slow ones (alignment 1: the register-staged
# analytic mainloop; a 32/64-deep K tile mostly empty anyway). A wide odd-C layer
# (C = 100: 2.x alignment 4 with cp.async) keeps its kernel rather than pay a copy
# of a large activation each call. Not measured at the boundary; a rule of thumb.
PAD_C_BELOW = 64


def _gemm_m(problem: ConvProblem) -> int:
    return problem.n_hint * problem.p * problem.q


def _sm90_config(problem: ConvProblem, num_sms: int) -> KernelConfig:
    """The TMA conv rule (families/conv_sm90.CANDIDATES): least whole waves x tile
    area / tile throughput; a 160-wide tile only where it divides K; ties to the
    larger tile."""
    m = _gemm_m(problem)
    best = None
    for tile, cluster, sched, speed in conv_sm90.CANDIDATES:
        if tile[1] == 160 and problem.k % 160:
            continue
        ctas = math.ceil(m / tile[0]) * math.ceil(problem.k / tile[1])
        cost = math.ceil(ctas / num_sms) * tile[0] * tile[1] / speed
        if best is None or cost < best[0]:
            best = (cost, tile, cluster, sched)
    _, tile, cluster, sched = best
    return conv_sm90.make_config(tile, cluster, sched)


def _sm80_config(problem: ConvProblem, num_sms: int, iterator: str) -> KernelConfig:
    configs = sm80.conv_configs(problem.dtype, problem.align_a, problem.align_b,
                                problem.align_c, iterator, n=problem.k)
    if not configs:
        raise ValueError(f"no CUTLASS 2.x conv config for {problem}")
    m = _gemm_m(problem)
    for cfg in configs:
        if math.ceil(m / cfg.tile[0]) * math.ceil(problem.k / cfg.tile[1]) >= num_sms // 2:
            return cfg
    return configs[-1]


def pad_channels(problem: ConvProblem, arch: str) -> ConvProblem:
    """``problem`` with C zero-padded to a multiple of 8 (``pad_c``, alignments 8)
    where that lets the sm90a TMA kernel run it: arch sm90a, f16/bf16, K % 8 == 0,
    C % 8 != 0 and C < PAD_C_BELOW, the im2col lowering not taking it (C < 8),
    padding/stride/dilation within the TMA im2col limits (conv_sm90.supports), an
    image larger than 1x1. Otherwise ``problem`` unchanged (sm80 keeps the 2.x
    kernels at C's own alignment)."""
    if (arch != "sm90a" or problem.pad_c or problem.groups != 1 or problem.c % 8 == 0
            or problem.c >= PAD_C_BELOW or problem.h * problem.w == 1):
        # a 1x1 image (a squeeze-excite block's expand conv: EfficientNet's C = 10,
        # 20, 28) is a GEMM of N rows, where the TMA kernel gains little, and the copy
        # into padded channels costs a second launch and a region call that cannot
        # replay in C++ (it reads a copy, not its input). On the H200 efficientnet-b0's
        # forward took the same time either way (session 29, docs/measured.md)
        return problem
    if conv_gemm_sm90.im2col_ok(problem):
        return problem                        # the im2col lowering reads C as it is
    padded = replace(problem, pad_c=-problem.c % 8, align_a=8, align_b=8)
    return padded if conv_sm90.supports(padded) else problem


# The TMA implicit-GEMM configs a conv search tries (tile, cluster): 128 x 128 and
# 128 x 64 with and without a 2x1 cluster (a 2-CTA cluster must fit in one GPC, so a grid of
# about a wave of clustered CTAs can spill into a second: the VAE's 64 x 64 x 512 ->
# 512, 128 CTAs of 128 x 128, ran 48.1 us with a 2x1 cluster and 28.6 without, H200),
# 64 x 128, and 128 x 160 for output widths that are multiples of 160. Fewer stages
# for two CTAs per SM (128 x 64 at 3, 64 x 64 at 4) lost on all 35 SD UNet and VAE
# 3x3 convs searched (up to 2.1x slower), so they are not tried.
TMA_SEARCH = (
    ((128, 128, 64), (2, 1, 1)),
    ((128, 128, 64), (1, 1, 1)),
    ((128, 64, 64), (2, 1, 1)),
    ((128, 64, 64), (1, 1, 1)),
    ((64, 128, 64), (1, 1, 1)),
    ((64, 64, 64), (1, 1, 1)),
    ((128, 160, 64), (1, 1, 1)),
)
# The im2col lowering is searched for outputs of at most this many pixels (N*P*Q):
# its pack writes N*P*Q x R*S*C elements, cheap only next to a K-deep GEMM with few
# output tiles (8 x 8 x 2560 -> 1280 at batch 2: 5.9 MB for 7.5 GFLOP).
IM2COL_SEARCH_MAX_ROWS = 512


# Split counts an im2col choice's GEMM may take (stream-K scheduler, split-K)
SPLITS = (2, 3, 4, 6, 8, 12)


def _split_k_choices(problem: ConvProblem, num_sms: int) -> list:
    """im2col choices whose GEMM splits K over the stream-K scheduler: 128 x 64 and
    128 x 128 tiles, each split count of SPLITS that keeps the work units within a
    wave of SMs and at least 4 K tiles per split."""
    gp = conv_gemm_sm90.gemm_problem(problem, "im2col")
    m = problem.n_hint * problem.p * problem.q
    out = []
    for tile_n in (64, 128):
        config = KernelConfig("cutlass3x_sm90", (128, tile_n, 64), 0, cluster=(1, 1, 1),
                              kernel_schedule=sm90.COOP, tile_scheduler="stream_k")
        tiles = math.ceil(m / 128) * math.ceil(gp.n / tile_n)
        for splits in SPLITS:
            if tiles * splits <= num_sms and gp.k // splits >= 4 * 64:
                out.append(ConvChoice("im2col", config,
                                      GemmLaunch(decomposition="split_k", splits=splits)))
    return out


def search_space(problem: ConvProblem, arch: str, num_sms: int) -> tuple:
    """The sm90a kernel choices worth timing on ``problem`` (a ConvProblem after
    ``pad_channels``): the rules' choice first, then every TMA_SEARCH config the
    TMA kernel can run, then for outputs of at most IM2COL_SEARCH_MAX_ROWS pixels
    the im2col lowering with the GEMM heuristic's config and with split-K. Empty
    for a depthwise conv, another arch, or a 2.x-only problem."""
    if arch != "sm90a" or problem.groups != 1:
        return ()
    try:
        first = choice_of(choose_conv_kernel(problem, arch, num_sms, table=False))
    except ValueError:
        return ()
    if first is None:
        return ()
    out = [first]
    if conv_sm90.supports(problem):
        out += [ConvChoice("", conv_sm90.make_config(t, c)) for t, c in TMA_SEARCH
                if t[1] != 160 or problem.k % 160 == 0]
    if (conv_gemm_sm90.im2col_feasible(problem)
            and problem.n_hint * problem.p * problem.q <= IM2COL_SEARCH_MAX_ROWS):
        config, launch = sm90.choose(conv_gemm_sm90.gemm_problem(problem, "im2col"), num_sms)
        out.append(ConvChoice("im2col", config, replace(launch, pdl=False)))
        out += _split_k_choices(problem, num_sms)
    return tuple({c.tag: c for c in reversed(out)}[t] for t in dict.fromkeys(c.tag for c in out))


def choice_of(kernel) -> ConvChoice | None:
    """The ConvChoice a 3.x ConvKernel embodies; None for any other kernel."""
    if not isinstance(kernel, ConvKernel) or kernel.config.family != "cutlass3x_sm90":
        return None
    return ConvChoice(kernel.iterator, kernel.config, kernel.launch)


def _applies(choice: ConvChoice, problem: ConvProblem) -> bool:
    """Whether ``choice``'s kernel can run ``problem`` (a stale table row need not)."""
    if choice.iterator == "direct":
        return conv_gemm_sm90.direct_ok(problem)
    if choice.iterator == "im2col":
        return conv_gemm_sm90.im2col_feasible(problem)
    return conv_sm90.supports(problem)


def choose_conv_kernel(problem: ConvProblem, arch: str, num_sms: int,
                       choice: ConvChoice | None = None, table: bool = True):
    """The kernel for one conv problem on ``arch``: a DepthwiseKernel for a
    depthwise conv (families/depthwise.py), else a ConvKernel (for its ``c_kernel`` channels:
    pass ``pad_channels(problem, arch)`` to allow channel padding); ValueError when
    none fits. On sm90a, ``choice`` (a search's candidate) or else the learned conv
    table's row (``table``) decides where it applies to the problem; otherwise the
    rules. A lowered conv's tile config and launch knobs are the sm90 GEMM
    heuristic's for its GEMM (the learned table, then the shape rules), compiled
    into its launcher; PDL is the launcher's own choice (emit/conv_gemm_sm90.py)."""
    if problem.epilogue.residual_per_sample:
        return _per_sample_kernel(problem, arch, num_sms, choice, table)
    if problem.depthwise:
        return depthwise.choose(problem, arch)
    if problem.grouped:
        return grouped_conv.choose(problem, arch, num_sms)
    common = dict(arch=arch, dtype=problem.dtype, align_a=problem.align_a, align_b=problem.align_b,
                  align_c=problem.align_c, epilogue=problem.epilogue)
    if arch == "sm90a":
        if choice is None and table:
            choice = conv_sm90_table.lookup(problem, num_sms)
        if choice is not None and _applies(choice, problem):
            return ConvKernel(config=choice.config, iterator=choice.iterator, launch=choice.launch,
                              **common)
    lowering = conv_gemm_sm90.iterator_for(problem) if arch == "sm90a" else ""
    if lowering:
        config, launch = sm90.choose(conv_gemm_sm90.gemm_problem(problem, lowering), num_sms)
        return ConvKernel(config=config, iterator=lowering, launch=replace(launch, pdl=False),
                          **common)
    if arch == "sm90a" and conv_sm90.supports(problem):
        return ConvKernel(config=_sm90_config(problem, num_sms), iterator="", **common)
    iterator = sm80.choose_iterator(problem.dtype, problem.c_kernel, problem.align_a)
    if iterator in ("few_channels", "fixed_channels"):
        # Those iterators leave filter positions r >= R unmasked on the activation
        # side of the last K tile (zeros only on the filter side), so an inf/NaN
        # input could leak into a neighbouring output as 0 * inf. Small-C convs
        # are cheap (a network's stem): take the exact-masking iterators.
        iterator = "optimized" if problem.align_a * BYTES[problem.dtype] >= 4 else "analytic"
    return ConvKernel(config=_sm80_config(problem, num_sms, iterator), iterator=iterator, **common)


def _per_sample_kernel(problem: ConvProblem, arch: str, num_sms: int, choice, table: bool) -> ConvKernel:
    """The TMA conv for a problem whose epilogue reads a per-sample vector (only its
    epilogue does: emit/templates/per_sample_broadcast.h); ValueError elsewhere."""
    if arch != "sm90a" or problem.depthwise or problem.grouped or not conv_sm90.supports(problem):
        raise ValueError("a per-sample residual runs on the sm90a TMA conv only (f16 / bf16, "
                         "C and K multiples of 8)")
    if choice is None and table:
        choice = conv_sm90_table.lookup(problem, num_sms)
    config = (choice.config if choice is not None and choice.iterator == ""
              else _sm90_config(problem, num_sms))
    return ConvKernel(config=config, iterator="", arch=arch, dtype=problem.dtype,
                      align_a=problem.align_a, align_b=problem.align_b, align_c=problem.align_c,
                      epilogue=problem.epilogue)


def without_per_sample_residual(region: ConvRegion) -> ConvRegion:
    """``region`` ending before its per-sample residual op (and the ReLU after it, if
    any): the conv, its bias and activation only; the residual op stays in the glue,
    with a note. For a conv whose best kernel is not the TMA conv (the only one
    whose epilogue reads a per-sample vector): a faster conv beats a fused add."""
    ep = region.problem.epilogue
    if not ep.residual_per_sample:
        raise ValueError(f"{region.name} has no per-sample residual")
    drop = 2 if ep.post_activation != "identity" else 1
    plain = replace(ep, residual="none", post_activation="identity", residual_broadcast=False,
                    residual_per_sample=False)
    head, _, _ = region.name.rpartition("_conv2d_")
    note = note_not_fused(region.nodes[-drop], "the conv's fastest kernel (not the TMA conv) reads "
                          "no per-sample vector")
    return replace(region, name=f"{head}_conv2d_{plain.tag}", nodes=region.nodes[:-drop], c=None,
                   problem=replace(region.problem, epilogue=plain), notes=region.notes + (note,))


def keeps_per_sample_residual(region: ConvRegion, arch: str, num_sms: int, choice=None) -> bool:
    """Whether ``region``'s conv, chosen without its per-sample residual, runs the TMA
    conv, so that the residual may stay fused (no other kernel's epilogue reads it)."""
    plain = without_per_sample_residual(region)
    try:
        k = choose_conv_kernel(plain.problem, arch, num_sms, choice)
    except ValueError:
        return False
    return isinstance(k, ConvKernel) and k.config.family == "cutlass3x_sm90" and k.iterator == ""
