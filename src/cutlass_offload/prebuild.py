"""Prebuild: fill the kernel cache before any model needs it (issue 17).

``chosen_attention_kernels`` lists the Hopper attention kernels select can choose
(sm_90a: the example's configs and the learned table's), ``chosen_conv_kernels``
the sm_90a TMA conv kernels (the rule's tiles and the learned conv table's choices). ``prebuild_kernels`` lists
the GEMM kernels a target's heuristic can choose for
16-byte-aligned problems: on sm_90a every config of the learned table
(select/tables) and of the shape rules (select/sm90.CONFIGS), on sm_80 the known
2.x configs (families/sm80.py); each for the given dtypes, epilogues and B
layouts. ``prebuild`` compiles them through the ordinary sharded build (local, or
Ray with ``executor``) into the content-addressed cache (``$CUTLASS_OFFLOAD_CACHE_DIR``,
which several machines may share): a later compile whose kernels are all there
compiles only its launchers. The launch knobs of sm90 kernels are run-time
arguments, so one object serves every raster order, swizzle and PDL choice.

``model_plan`` takes the kernels of named models instead (``prebuild --models``):
the plans ``cutlass-offload compile MODEL`` would build, every kind of kernel
(lowered convs, norms, sm80 fallbacks included), merged into one plan.

The regions built here are stand-ins (one per kernel, named ``prebuild<i>``) or the
models' own regions (renamed ``<model>_<dtype>_<region>``); the library they link
into is cached like any other and not used.
"""
from __future__ import annotations

import difflib
from itertools import product

from . import build as build_stage
from .families import sm80 as sm80_family
from .families import attention_sm90
from .ir import (ACTIVATIONS, AttentionKernelSm90, AttentionProblem, AttentionRegion, ConvChoice,
                 ConvKernel,
                 ConvProblem, ConvRegion, GemmEpilogue,
                 GemmKernel, GemmProblem, GemmRegion, Plan)
from .select import sm90

# The epilogues of the built-in and zoo models' GEMMs (benchmarks/corpus): plain,
# bias, bias + relu / gelu (erf, tanh) / silu, bias + residual add, residual add,
# SiLU gate * up as a fused multiply (a SwiGLU pair gated_gemm cannot interleave) and
# as one GEMM with a GLU epilogue (llama's SwiGLU, the UNet's GEGLU with a bias; sm90a
# only).
DEFAULT_EPILOGUES = ("plain", "bias", "bias_relu", "bias_gelu", "bias_gelutanh", "bias_silu",
                     "bias_resadd", "resadd", "silu_resmul", "glu_silu", "bias_glu_gelu")


def known_epilogues() -> dict:
    """{tag: GemmEpilogue} of every epilogue a GEMM region can carry (full-shape
    residuals only; the post activation only after a residual)."""
    out = {}
    for bias, act, res in product((False, True), ACTIVATIONS, ("none", "add", "mul")):
        for post in (("identity", "relu") if res != "none" else ("identity",)):
            ep = GemmEpilogue(bias=bias, activation=act, residual=res, post_activation=post)
            out[ep.tag] = ep
    for bias, act in product((False, True), ACTIVATIONS):     # gated linear units (sm90a)
        ep = GemmEpilogue(bias=bias, activation=act, glu=True)
        out[ep.tag] = ep
    return out


def epilogues(tags) -> list:
    """GemmEpilogues for ``tags`` (GemmEpilogue.tag spellings, e.g. "bias_gelu").
    Raises ValueError naming an unknown tag and the known ones."""
    known = known_epilogues()
    bad = [t for t in tags if t not in known]
    if bad:
        close = difflib.get_close_matches(bad[0], known, n=3)
        acts = sorted({ep.tag.split("_")[-1] for ep in known.values() if ep.glu and ep.bias} - {"glu"})
        raise ValueError(
            f"unknown epilogue {bad[0]!r}" + (f" (did you mean {', '.join(close)}?)" if close else "")
            + f"; tags are plain, [bias_]ACT, [bias_][ACT_]resadd|resmul[_relu] or [bias_]glu_ACT, "
            f"ACT one of {', '.join(acts)} ({len(known)} in all)")
    return [known[t] for t in tags]


def _configs(arch: str, dtype: str) -> list:
    if arch == "sm90a":
        table = sm90.default_table()
        chosen = list(table.entries.values()) + list(table.residual.values()) if table else []
        seen = list(dict.fromkeys(list(sm90.CONFIGS.values()) + [c for c, _ in chosen]))
        return [c for c in seen if c.family == "cutlass3x_sm90"]
    return sm80_family.gemm_configs(dtype, 8, 8, 8)


def prebuild_kernels(arch: str, dtypes=("f16", "bf16"), epilogue_tags=DEFAULT_EPILOGUES,
                     layouts=("col",)) -> list:
    """The distinct GemmKernels to prebuild for ``arch`` ("sm90a" / "sm80"), 8-element
    aligned operands; GLU epilogues on sm90a only (no other family has one).
    ValueError for an unknown epilogue tag, dtype or layout."""
    kernels = {}
    for dtype, ep, layout in product(dtypes, epilogues(epilogue_tags), layouts):
        if ep.glu and arch != "sm90a":
            continue
        for config in _configs(arch, dtype):
            k = GemmKernel(arch=arch, dtype=dtype, layout_b=layout, align_a=8, align_b=8,
                           align_c=8, epilogue=ep, config=config)
            if sm90.takes(k, config):            # no GLU epilogue on an N-split tile
                kernels.setdefault(k.name, k)
    return list(kernels.values())


# The conv epilogues of the built-in and zoo models (benchmarks/corpus): a folded
# BatchNorm's bias alone or with ReLU / SiLU / GELU, squeeze-excite's sigmoid, and a
# residual add with or without a ReLU after it (ResNet's bottleneck).
DEFAULT_CONV_EPILOGUES = ("bias", "bias_relu", "bias_silu", "bias_gelu", "bias_sigmoid",
                          "bias_resadd", "bias_resadd_relu")


def chosen_conv_kernels(dtypes=("f16", "bf16"), epilogue_tags=DEFAULT_CONV_EPILOGUES) -> list:
    """The sm_90a TMA conv kernels select can choose for convs with C and K multiples
    of 8 (select/conv.py): every tile of the shape rule (families/conv_sm90.CANDIDATES)
    and every choice of the learned conv table (families/conv_sm90_table.json: TMA
    tiles and clusters, im2col lowerings with their split-K launch compiled in), for
    each dtype and epilogue. ValueError for an unknown epilogue tag."""
    from .families import conv_sm90, conv_sm90_table
    choices = [ConvChoice("", conv_sm90.make_config(t, c, s)) for t, c, s, _ in conv_sm90.CANDIDATES]
    choices += list(conv_sm90_table.choices())
    kernels = {}
    for dtype, ep, ch in product(dtypes, epilogues(epilogue_tags), choices):
        k = ConvKernel(arch="sm90a", dtype=dtype, align_a=8, align_b=8, align_c=8, epilogue=ep,
                       config=ch.config, iterator=ch.iterator, launch=ch.launch)
        kernels.setdefault(k.name, k)
    return list(kernels.values())


def chosen_attention_kernels(dtypes=("f16", "bf16")) -> list:
    """The Hopper attention kernels select can choose without a search: the default
    config per default head tile (attention_sm90.default_config) and every config of
    the learned table (families/attention_sm90_table.json), each unmasked and causal
    where its tile order allows (attention_sm90.legal_for), per dtype."""
    learned = attention_sm90.learned_configs()
    kernels = {}
    for causal in (False, True):
        # a causal problem of one query tile keeps the example's order (default_config)
        orders = ("persistent", attention_sm90.CAUSAL_DEFAULT_ORDER) if causal else ("persistent",)
        defaults = [attention_sm90.config_for(h, order=o)
                    for h in attention_sm90.DEFAULT_HEAD_TILES for o in orders]
        for c in dict.fromkeys(defaults + learned):
            if attention_sm90.legal_for(c, causal):
                for d in dtypes:
                    k = AttentionKernelSm90(arch="sm90a", dtype=d, config=c, causal=causal)
                    kernels.setdefault(k.name, k)
    return list(kernels.values())


def _attention_stand_in(i: int, k: AttentionKernelSm90) -> AttentionRegion:
    d = k.head_tile
    problem = AttentionProblem(heads=1, seq_q=128, seq_kv=128, head_dim=d, head_dim_v=d,
                               dtype=k.dtype, scale=d ** -0.5,
                               causal="top_left" if k.causal else "none")
    return AttentionRegion(name=f"prebuild{i}", form="sdpa", nodes=(f"prebuild{i}",),
                           q="q", k="k", v="v", problem=problem)


def _conv_stand_in(i: int, k: ConvKernel) -> ConvRegion:
    ep = k.epilogue
    problem = ConvProblem(c=k.align_a, k=max(8, k.align_c), h=8, w=8, r=3, s=3, dtype=k.dtype,
                          align_a=k.align_a, align_b=k.align_b, align_c=k.align_c,
                          pad=(1, 1, 1, 1), epilogue=ep)
    return ConvRegion(name=f"prebuild{i}", form="conv2d", nodes=(f"prebuild{i}",), x="x", w="w",
                      problem=problem, bias="bias" if ep.bias else None,
                      c="c" if ep.residual != "none" else None)


def stand_in_plan(arch: str, kernels) -> Plan:
    """A Plan of one stand-in region per kernel (what the build needs: names and
    kernels); GemmKernels, conv kernels (a conv search's candidates) and Hopper
    attention kernels."""
    regions = []
    for i, k in enumerate(kernels):
        if isinstance(k, AttentionKernelSm90):
            regions.append(_attention_stand_in(i, k))
            continue
        if isinstance(k, ConvKernel):
            regions.append(_conv_stand_in(i, k))
            continue
        ep = k.epilogue
        problem = GemmProblem(n=64, k=64, dtype=k.dtype, layout_b=k.layout_b, align_a=k.align_a,
                              align_b=k.align_b, align_c=k.align_c, epilogue=ep)
        regions.append(GemmRegion(name=f"prebuild{i}", form="linear", nodes=(f"prebuild{i}",), a="a",
                                  b="b", problem=problem, bias="bias" if ep.bias else None,
                                  c="c" if ep.residual != "none" else None,
                                  b_nk=k.layout_b == "col"))
    return Plan(arch=arch, regions=tuple(regions), kernels=tuple(kernels), fallbacks=())


def model_plan(names, arch: str, dtypes=("f16",), skipped: dict | None = None,
               progress=None, batch: int | None = None, seq: int | None = None) -> Plan:
    """One Plan holding the regions and kernels that ``cutlass-offload compile NAME
    --arch ARCH --dtype D`` selects for each model name (built-ins or
    ``package.module:factory``, models.load_model) and dtype, with every norm
    offloaded (the eager glue's choice, a superset of the Inductor glue's); regions
    renamed ``<name>_<dtype>_<region>`` so that models never clash. Raises what
    load_model, capture and partition raise (an unknown name: ValueError), except
    that with a ``skipped`` dict a model whose package is missing (ImportError) is
    left out and recorded there (name -> the error's text), so the others still
    build. ``progress``: called with a line per model and dtype as its capture starts
    (each takes seconds: the CLI prints them). batch / seq: the built-in models' sizes
    (``compile --batch / --seq``; None: their defaults); a factory keeps its own."""
    from dataclasses import replace as _replace

    from .capture import capture
    from .config import CompileOptions, options_for_glue
    from .models import BUILTIN, load_model
    from .partition import partition
    from .select import select
    regions, kernels = [], []
    for name, dtype in product(names, dtypes):
        if skipped is not None and name in skipped:
            continue
        if progress is not None:
            progress(f"prebuild: capturing {name} ({dtype}) and selecting its kernels")
        try:
            sizes = (batch, seq) if name in BUILTIN else (None, None)
            model, inputs = load_model(name, _CLI[dtype], *sizes)
        except ImportError as e:
            if skipped is None:
                raise
            skipped[name] = f"{type(e).__name__}: {e}"
            continue
        options = options_for_glue(CompileOptions(arch=arch), "eager")
        plan = select(partition(capture(model, inputs).graph_module, options), arch, options)
        tag = f"{name.replace(':', '_').replace('.', '_').replace('-', '_')}_{dtype}_"
        regions += [_replace(r, name=tag + r.name) for r in plan.regions]
        kernels += list(plan.kernels)
    return Plan(arch=arch, regions=tuple(regions), kernels=tuple(kernels), fallbacks=())


_CLI = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}


def prebuild(arch: str, kernels, executor=None, plan: Plan | None = None, jobs: int | None = None):
    """Compile ``kernels`` (or, given ``plan``, its kernels: ``model_plan``) into the
    cache (sharded build) with ``jobs`` parallel nvcc processes (None: as
    CompileOptions.jobs). Returns the build's result (build/result.py: units,
    seconds, cache hits); a kernel that fails to compile is reported there and
    cached as failed, the others are kept."""
    if plan is not None and kernels:
        plan = Plan(arch=arch, regions=plan.regions + stand_in_plan(arch, kernels).regions,
                    kernels=plan.kernels + tuple(kernels), fallbacks=())
    return build_stage.build(plan if plan is not None else stand_in_plan(arch, kernels), "sharded",
                             jobs=jobs, executor=executor)
