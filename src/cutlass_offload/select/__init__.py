"""Select: regions -> kernel instantiations (a pure function of problem and target)."""
from __future__ import annotations

import json
from dataclasses import asdict, replace

from ..config import CompileOptions
from ..target import TARGETS
from ..families import attention  # the sm80 kernel, for sm_80 and sm_90a (or the Hopper one)
from ..families import attention_sm90
from ..families import conv_sm90_table
from ..ir import (
    AttentionKernelSm90,
    AttentionRegion,
    ConvRegion,
    Fallback,
    GemmKernel,
    GemmLaunch,
    GemmProblem,
    GemmRegion,
    GroupNormRegion,
    KernelConfig,
    NormRegion,
    Note,
    PartitionResult,
    Plan,
    anchor_node,
)
from . import pytorch_faster, sm80, sm90
from .conv import (choose_conv_kernel, keeps_per_sample_residual, pad_channels,
                   without_per_sample_residual)
from .group_norm import choose_group_norm_kernel
from .norm import choose_norm_kernel

DEFAULT_NUM_SMS = {arch: t.num_sms for arch, t in TARGETS.items()}   # target.py


def _kernel(problem: GemmProblem, arch: str, config, launch=GemmLaunch()) -> GemmKernel:
    return GemmKernel(arch=arch, dtype=problem.dtype, layout_b=problem.layout_b,
                      align_a=problem.align_a, align_b=problem.align_b, align_c=problem.align_c,
                      epilogue=problem.epilogue, config=config, layout_a=problem.layout_a,
                      launch=launch)


def choose_kernel(problem: GemmProblem, arch: str, num_sms: int | None = None,
                  tuned: dict | None = None, table=True) -> GemmKernel:
    """The kernel for one problem on ``arch`` ("sm90a" or "sm80"): the profiled
    winner when ``tuned`` ({tuning_id(problem): (KernelConfig, GemmLaunch)}, from
    tune/; a bare KernelConfig means the default launch) has one, else the
    heuristic's (sm90: the learned table, then the shape rules; ``table`` as for
    select.sm90.choose).

    Raises ValueError when no kernel family can run the problem class (a GLU
    epilogue off the sm90a kernels included).
    """
    num_sms = num_sms or DEFAULT_NUM_SMS[arch]
    if problem.epilogue.residual_broadcast:
        raise ValueError("GEMM kernels take a full-shape residual only")
    choice = (tuned or {}).get(tuning_id(problem))
    if isinstance(choice, KernelConfig):
        choice = (choice, GemmLaunch())
    if choice is None:
        if arch == "sm90a" and sm90.supports(problem):
            choice = sm90.choose(problem, num_sms, table)
        elif problem.epilogue.glu:
            raise ValueError("a GLU epilogue runs on the sm90a (CUTLASS 3.x) GEMM kernels only: "
                             "f16 / bf16 with 16-byte aligned operands")
        else:
            choice = (sm80.choose(problem, num_sms), GemmLaunch())
    return _kernel(problem, arch, *choice)


def candidate_kernels(problem: GemmProblem, arch: str, num_sms: int | None = None) -> tuple:
    """A few kernels worth profiling for ``problem`` (at most 4, the heuristic's
    first, with its launch; see select/sm90.py and select/sm80.py; tune/ searches
    sm90's whole SPACE instead). ValueError as choose_kernel."""
    first = choose_kernel(problem, arch, num_sms)
    num_sms = num_sms or DEFAULT_NUM_SMS[arch]
    if first.config.family == "cutlass3x_sm90":
        configs = sm90.candidates(problem, num_sms)
    else:
        configs = sm80.candidates(problem, num_sms)
    rest = tuple(_kernel(problem, arch, c) for c in configs if c != first.config)
    return (first,) + rest[:3]


def tuning_id(problem: GemmProblem) -> str:
    """What a tuning result is about: the GEMM's sizes at the example (hint) size,
    dtypes, layouts, alignments and epilogue, as canonical JSON. Equal for regions
    that would run the same kernel on the same problem."""
    m = problem.m if problem.m is not None else problem.m_hint
    batch = problem.batch if problem.batch is not None else problem.batch_hint
    return json.dumps({"op": "gemm", "m": m, "n": problem.n, "k": problem.k, "batch": batch,
                       "dtype": problem.dtype, "tf32": problem.tf32, "layout_a": problem.layout_a,
                       "layout_b": problem.layout_b, "a_batch_broadcast": problem.a_batch_broadcast,
                       "align": [problem.align_a, problem.align_b, problem.align_c],
                       "epilogue": epilogue_id(problem.epilogue)}, sort_keys=True)


def epilogue_id(ep) -> dict:
    """A GemmEpilogue as the tuning ids spell it: its fields, ``glu`` and
    ``residual_per_sample`` only when set (so the ids of every other problem, and the
    tuning caches keyed on them, are what they were before those fields existed)."""
    out = asdict(ep)
    for later in ("glu", "residual_per_sample"):
        if not out[later]:
            del out[later]
    return out


def attention_tuning_id(problem) -> str:
    """What a profiled attention choice is about (a Hopper config for one kernel
    problem): sizes at the example batch, head dims, dtype, mask, as canonical JSON."""
    batch = problem.batch if problem.batch is not None else problem.batch_hint
    # soft-cap, K/V grouping and window only when set: the ids of every other problem are
    # what they were before those fields existed
    extra = {k: v for k, v, unset in (("softcap", problem.softcap, 0.0),
                                      ("kv_group", problem.kv_group, 1),
                                      ("window", problem.window, 0)) if v != unset}
    return json.dumps({"op": "attention", "batch": batch, "heads": problem.heads,
                       "seq_q": problem.seq_q, "seq_kv": problem.seq_kv, "head_dim": problem.head_dim,
                       "head_dim_v": problem.head_dim_v, "dtype": problem.dtype,
                       "causal": problem.causal, "bias": problem.bias, **extra}, sort_keys=True)


def conv_tuning_id(problem) -> str:
    """What a searched conv choice is about (families/conv_sm90_table.class_key of
    the problem, with its dtype and epilogue), as canonical JSON."""
    return json.dumps({"op": "conv2d", "class": conv_sm90_table.class_key(problem),
                       "dtype": problem.dtype, "epilogue": epilogue_id(problem.epilogue)}, sort_keys=True)


def kernel_tag(config_tag: str, launch: GemmLaunch | None) -> str:
    """A GEMM kernel's config and launch knobs as tune/ and benchmarks/kernels_bench.py's
    rows name them ("128x128x64_c1x1x1_pingpong+along_m_pdl")."""
    knobs = launch or GemmLaunch()
    return config_tag if knobs == GemmLaunch() else f"{config_tag}+{knobs.tag}"


def gemm_kernel_tag(k: GemmKernel) -> str:
    return kernel_tag(k.config.tag, k.launch)


def _defer_measured(r) -> bool:
    """Whether PyTorch's op for ``r`` is the one the benchmark timed: a conv, or an
    attention without a mask folded into the kernel and without a bias (a model's
    SDPA with an explicit mask tensor runs a slower PyTorch kernel than the
    is_causal one measured, while ours folds the mask)."""
    if isinstance(r, ConvRegion):
        return True
    return isinstance(r, AttentionRegion) and r.mask is None and r.bias is None


# One row per region kind: (region, arch, num_sms, options, tuned GEMM winners) ->
# (region, kernel); the region comes back changed where the choice changes what it
# runs (a conv's zero-padded channels). ValueError: no kernel, the region falls back.
def _gemm(r, arch, num_sms, options, tuned):
    kernel = choose_kernel(r.problem, arch, options.num_sms, tuned)
    why = sm90.refusal(r.problem) if arch == "sm90a" else None
    if why:         # said in the report: an sm_90a build running a 2.x kernel is not obvious
        r = replace(r, notes=r.notes + (Note(f"a CUTLASS 2.x (sm80) kernel: {why}"),))
    return r, kernel


def _conv(r, arch, num_sms, options, tuned):
    # C not a multiple of 8: zero-padded channels let a TMA kernel run it
    r = replace(r, problem=pad_channels(r.problem, arch))
    if r.problem.epilogue.residual_per_sample:
        # only the TMA conv reads a per-sample vector: where the conv alone would run
        # another kernel, that kernel wins and the add runs in the glue
        plain = without_per_sample_residual(r)
        if not keeps_per_sample_residual(r, arch, num_sms, (tuned or {}).get(conv_tuning_id(plain.problem))):
            r = plain
    return r, choose_conv_kernel(r.problem, arch, num_sms, (tuned or {}).get(conv_tuning_id(r.problem)))


def _attention(r, arch, num_sms, options, tuned):
    k = attention.choose(r.kernel_problem, arch,
                         (tuned or {}).get(attention_tuning_id(r.kernel_problem)))
    if arch == "sm90a" and not isinstance(k, AttentionKernelSm90):
        # say why a Hopper target runs the Ampere-generation kernel (a padding mask, say)
        why = attention_sm90.refusal(r.kernel_problem, arch)
        if why:
            r = replace(r, notes=tuple(r.notes) + (
                Note(f"runs the sm80 attention kernel on sm_90a: {why}"),))
    return r, k


def _norm(r, arch, num_sms, options, tuned):
    return r, choose_norm_kernel(r.problem, arch)


def _group_norm(r, arch, num_sms, options, tuned):
    return r, choose_group_norm_kernel(r.problem, arch)


CHOOSERS = {GemmRegion: _gemm, ConvRegion: _conv, AttentionRegion: _attention,
            NormRegion: _norm, GroupNormRegion: _group_norm}


def select(part: PartitionResult, arch: str, options: CompileOptions = CompileOptions(),
           tuned: dict | None = None) -> Plan:
    """Choose a kernel per region; regions with no legal kernel become fallbacks, as
    do GEMM / conv2d / attention regions PyTorch was measured to run faster
    (``options.pytorch_when_faster``, select/pytorch_faster.py).

    tuned: {tuning_id(problem): (KernelConfig, GemmLaunch)} of profiled GEMM winners (tune/),
    {attention_tuning_id(problem): KernelConfig} of Hopper attention configs and
    {conv_tuning_id(problem): ConvChoice} of sm90a conv choices (a search's
    candidates, benchmarks/kernels_bench.py); other problems get the heuristic's choice."""
    regions, kernels, fallbacks = [], [], list(part.fallbacks)
    num_sms = options.num_sms or DEFAULT_NUM_SMS[arch]
    defer = options.pytorch_when_faster and not options.strict
    for r in part.regions:
        if defer and _defer_measured(r):
            why = pytorch_faster.reason(r.problem, arch, num_sms, glue=options.glue)
            if why is not None:
                fallbacks.append(Fallback(anchor_node(r), r.form, why, nodes=r.nodes))
                continue
        try:
            r, k = CHOOSERS[type(r)](r, arch, num_sms, options, tuned)
        except ValueError as e:
            fallbacks.append(Fallback(anchor_node(r), r.form, f"no kernel: {e}", nodes=r.nodes))
            continue
        if defer and isinstance(r, GemmRegion):
            # a GEMM entry names the kernel it timed: asked after the choice
            why = pytorch_faster.reason(r.problem, arch, num_sms, gemm_kernel_tag(k), options.glue)
            if why is not None:
                fallbacks.append(Fallback(anchor_node(r), r.form, why, nodes=r.nodes))
                continue
        regions.append(r)
        kernels.append(k)
    return Plan(arch=arch, regions=tuple(regions), kernels=tuple(kernels), fallbacks=tuple(fallbacks))
