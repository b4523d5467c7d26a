"""Emit: a Plan -> C++ translation units.

Each distinct kernel instantiation is emitted once (kernels are keyed by their
procedural name) and shared by every region that uses it; each header is included
once per translation unit, in first-use order; each region gets one thin
``extern "C"`` launcher. Kernel entry points (``<kernel>::run`` and
``<kernel>::workspace_size``) are declared weak, so the same kernel may sit in
several objects of one library (cached shards, per-region modules) and link once.
See emit/templates/prelude.h for the C ABI.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..abi import WORKSPACE_SUFFIX, region_symbol  # noqa: F401 - region_symbol re-exported
from ..ir import KernelSource, Plan
from . import (attention, attention_sm90, conv_gemm_sm90, conv_sm80, conv_sm90, depthwise, gemm_sm80,
               gemm_sm90, group_norm, norm)


TEMPLATES = Path(__file__).parent / "templates"
# (kernel kind, family) -> the emitter module: emit(kernel) -> KernelSource.
_EMITTERS = {
    ("gemm", "cutlass2x_sm80"): gemm_sm80, ("gemm", "cutlass3x_sm90"): gemm_sm90,
    ("conv2d_fprop", "cutlass2x_sm80"): conv_sm80, ("conv2d_fprop", "cutlass3x_sm90"): conv_sm90,
    ("conv2d_fprop", "direct_depthwise"): depthwise,
    ("layer_norm", "rowwise_norm"): norm, ("rms_norm", "rowwise_norm"): norm,
    ("group_norm", "nhwc_group_norm"): group_norm,
    ("attention", "cutlass2x_sm80"): attention,   # sm80 kernel for sm_80 and sm_90a
    ("attention", "cutlass3x_sm90"): attention_sm90,
    # a conv lowered onto the sm90 GEMM (ConvKernel.iterator "direct" / "im2col")
    ("conv2d_fprop", "cutlass3x_sm90", "gemm"): conv_gemm_sm90}


def _emitter(kernel):
    key = (kernel.kind, kernel.config.family)
    if kernel.kind == "conv2d_fprop" and kernel.config.family == "cutlass3x_sm90" and kernel.iterator:
        key += ("gemm",)
    return _EMITTERS[key]


@dataclass(frozen=True)
class TranslationUnit:
    """text: the whole .cu; kernel_spans: (kernel name, first line, last line),
    1-based, to map compiler errors back to kernels; symbols: (region, C symbol);
    flags: nvcc options its compile adds (its kernels' ``KernelSource.nvcc_flags``)."""

    text: str
    kernel_spans: tuple = ()
    symbols: tuple = ()
    flags: tuple = ()

    @property
    def kernels(self) -> tuple:
        return tuple(name for name, _, _ in self.kernel_spans)

    def kernel_at_line(self, line: int):
        for name, lo, hi in self.kernel_spans:
            if lo <= line <= hi:
                return name
        return None


def emit_kernel(kernel) -> KernelSource:
    """C++ for one kernel instantiation (GemmKernel, ConvKernel or NormKernel).

    Raises ValueError for an illegal kernel."""
    return _emitter(kernel).emit(kernel)


def emit_kernels(plan: Plan) -> dict:
    """{kernel name: KernelSource}, each distinct kernel once, in first-use order."""
    sources = {}
    for k in plan.kernels:
        if k.name not in sources:
            sources[k.name] = emit_kernel(k)
    return sources


def _prelude() -> list:
    """prelude.h inlined (a TU is self-contained); its include guard is for headers only."""
    return [l for l in (TEMPLATES / "prelude.h").read_text().splitlines() if l != "#pragma once"]


def _declarations(name: str, weak: bool, args_type: str) -> list:
    attr = "__attribute__((weak)) " if weak else ""
    return [f"namespace {name} {{",
            f"{attr}int64_t workspace_size(const {args_type}& args);",
            f"{attr}int run(const {args_type}& args, cudaStream_t stream);",
            f"}}  // namespace {name}"]


def _launchers(plan: Plan, regions=None) -> tuple:
    lines, symbols = [], []
    for region, kernel in plan.pairs:
        if regions is not None and region.name not in regions:
            continue
        sym = region_symbol(region.name)
        symbols.append((region.name, sym))
        args = kernel.args_type
        lines += [
            f"// {region.name}: {region.form} -> {kernel.name}",
            f'extern "C" int {sym}(const {args}* args, cudaStream_t stream) {{',
            f"  return {kernel.name}::run(*args, stream);",
            "}",
            f'extern "C" int64_t {sym}{WORKSPACE_SUFFIX}(const {args}* args) {{',
            f"  return {kernel.name}::workspace_size(*args);",
            "}",
        ]
    return lines, tuple(symbols)


def _library_info(plan: Plan) -> list:
    info = json.dumps({"arch": plan.arch, "kernels": [k.name for k in plan.distinct_kernels],
                       "regions": [r.name for r in plan.regions]})
    return ['extern "C" const char* co_library_info() {', f"  return {json.dumps(info)};", "}"]


def emit_unit(sources: list, header: str, tail: list = (), symbols=()) -> TranslationUnit:
    """One translation unit: the sources' defines, prelude, preamble blocks and
    includes (each once), weak declarations and code of ``sources`` (KernelSource
    list), then ``tail`` lines. Sources must be able to share a TU (build.shards.unit_class);
    ValueError for sources that need different nvcc flags."""
    flags = {tuple(s.nvcc_flags) for s in sources}
    if len(flags) > 1:
        raise ValueError("kernels compiled with different nvcc flags cannot share a unit: "
                         + "; ".join(f"{s.name}: {' '.join(s.nvcc_flags) or '(none)'}" for s in sources))
    includes, defines, preamble = {}, {}, {}
    for s in sources:
        for inc in s.includes:
            includes.setdefault(inc, None)
        for d in s.defines:
            defines.setdefault(d, None)
        for block in s.preamble:
            preamble.setdefault(block, None)
    lines = [f"// Generated by cutlass_offload: {header}"]
    lines += [f"#define {d} 1" for d in defines]          # before any CUTLASS header
    lines += _prelude()
    for block in preamble:
        lines += block.splitlines()
    lines += [f"#include <{inc}>" for inc in includes]
    spans = []
    for s in sources:
        start = len(lines) + 1
        lines += _declarations(s.name, weak=True, args_type=s.args_type)
        lines += s.code.splitlines()
        spans.append((s.name, start, len(lines)))
    lines += [""] + list(tail) + [""]
    return TranslationUnit("\n".join(lines), tuple(spans), tuple(symbols), next(iter(flags), ()))


def emit_library(plan: Plan) -> TranslationUnit:
    """The single translation unit holding every kernel of ``plan`` and its launchers.

    Not for plans mixing CUTLASS 3.x convs with GEMMs (their headers clash; see
    build.shards.header_compatible_groups): the build splits those first."""
    sources = list(emit_kernels(plan).values())
    launch, symbols = _launchers(plan)
    return emit_unit(sources, f"target {plan.arch}; {len(sources)} distinct kernels; "
                     f"{len(plan.regions)} regions; one translation unit",
                     launch + _library_info(plan), symbols)


def emit_launchers(plan: Plan, regions=None) -> TranslationUnit:
    """Launchers only (no CUTLASS headers): declarations of the kernels' entry
    points, one extern "C" launcher per region (those in ``regions`` if given) and
    co_library_info. Compiles in about a second."""
    decls = []
    for k in plan.distinct_kernels:
        decls += _declarations(k.name, weak=False, args_type=k.args_type)
    launch, symbols = _launchers(plan, regions)
    lines = [f"// Generated by cutlass_offload: launchers for target {plan.arch}"] + _prelude()
    lines += decls + [""] + launch + _library_info(plan) + [""]
    return TranslationUnit("\n".join(lines), (), symbols)


def emit_region_unit(plan: Plan, index: int, sources: dict) -> TranslationUnit:
    """One region's own module (the per-region strategy): its kernel and launcher."""
    region, kernel = plan.regions[index], plan.kernels[index]
    launch, symbols = _launchers(plan, {region.name})
    return emit_unit([sources[kernel.name]], f"{region.name} alone", launch, symbols)


def emit_info_unit(plan: Plan) -> TranslationUnit:
    lines = ["// Generated by cutlass_offload: library info"] + _library_info(plan) + [""]
    return TranslationUnit("\n".join(lines))
