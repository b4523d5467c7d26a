"""The dry run: what ``compile`` would offload and build, in seconds, before a long
cold build. Capture, partition and kernel selection as ``compile`` runs them; the
build is only previewed (build/preview.py): no nvcc compile, no GPU, nothing written.

    dry = cutlass_offload.explain(model, (x,), arch="sm_90a")
    print(dry)      # compile's report, then "N kernels in M units: K cached, U to compile"
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import torch

from .api import _check_strict, resolve_arch
from .build.preview import BuildPreview, preview
from .capture import capture, dtype_mismatch
from .front import capture_errors, checked_inputs, compile_options
from .partition import partition
from .partition.flops import node_flops
from .partition.graph_utils import input_summary, module_paths
from .report import Report
from .runtime.glue import GlueSpec
from .select import select


@dataclass
class DryRun:
    """What ``compile`` with the same arguments would do, without doing it.

    report: the Report that compile's would be up to its build: regions, fallbacks
      with their reasons, kernels, the FLOPs share, the glue; its ``phases`` are
      the dry run's own seconds and its ``build`` is empty.
    build: a build.preview.BuildPreview: the translation units the build strategy
      would make and, for each, whether the kernel cache already holds it.
    ``str()`` / ``format()``: the report as compile prints it, then the build's
    summary and units; ``to_dict()``: both as JSON-ready data.
    """

    report: Report
    build: BuildPreview

    @property
    def regions(self) -> list:
        return self.report.regions

    @property
    def fallbacks(self) -> list:
        return self.report.fallbacks

    def to_dict(self) -> dict:
        return {"report": self.report.to_dict(), "build": self.build.to_dict()}

    def format(self) -> str:
        return self.report.format() + "\n" + self.build.format()

    def __str__(self) -> str:
        return self.format()

    def _repr_pretty_(self, p, cycle) -> None:       # IPython / Jupyter show the readable form
        p.text(self.format())


def explain(model: torch.nn.Module, example_inputs: tuple, *, arch: str | None = None,
            allow_tf32: bool = False, dynamic_batch: bool = False, dynamic_shapes=None,
            strict: bool = False, num_sms: int | None = None, build_strategy: str = "sharded",
            glue: str = "auto", mode: str | None = None, options: dict | None = None,
            offload_norms: str = "auto", combine_gemms: bool = True,
            decompose_wide_attention: bool = True, jobs: int | None = None) -> DryRun:
    """A dry run of ``compile(model, example_inputs, ...)`` with these arguments (as
    compile takes them; ``jobs`` plans the shards as the build would): capture,
    partition and kernel selection, then the build's units looked up in the kernel
    cache. Nothing is compiled (nvcc is asked only for its version, as a build's
    cache keys need), no GPU is used when ``arch`` is given, nothing is written.
    ``model`` is put in eval mode, as compile does; nothing else of it changes.

    Returns a DryRun (``print()`` it). Without nvcc or CUTLASS the units are listed
    with their cache state unknown (``build.toolchain_error`` says why; compile would
    raise ToolchainError).
    Raises what compile raises before its build: TypeError for a model that is not an
    nn.Module or example inputs that are not a tuple (or one tensor), InputsError (a
    TypeError) for inputs its forward cannot take positionally, ValueError for
    an unknown arch, glue, mode, option or build strategy, or dynamic_batch with
    dynamic_shapes, DeviceError when ``arch`` is None and no supported GPU is
    visible, CaptureError when torch.export cannot capture the model (the original
    error its ``__cause__``), CutlassOffloadError when ``strict`` and an offloadable
    op falls back.
    """
    example_inputs = checked_inputs(model, example_inputs, dynamic_batch, dynamic_shapes)
    spec = GlueSpec(glue, mode, options)
    opts = compile_options(spec, arch=resolve_arch(arch), allow_tf32=allow_tf32, strict=strict,
                           num_sms=num_sms, build_strategy=build_strategy, offload_norms=offload_norms,
                           combine_gemms=combine_gemms, jobs=jobs,
                           decompose_wide_attention=decompose_wide_attention)
    if (mismatch := dtype_mismatch(model, example_inputs)) is not None:
        warnings.warn(mismatch, stacklevel=2)
    phases, t0 = {}, time.perf_counter()
    with capture_errors():
        cap = capture(model, example_inputs, dynamic_batch=dynamic_batch, dynamic_shapes=dynamic_shapes)
    phases["capture"], t0 = time.perf_counter() - t0, time.perf_counter()
    part = partition(cap.graph_module, opts)
    flops = node_flops(cap.graph_module)        # after partition's rewrites, as compile counts
    phases["partition"], t0 = time.perf_counter() - t0, time.perf_counter()
    plan = select(part, opts.arch, opts)
    phases["select"], t0 = time.perf_counter() - t0, time.perf_counter()
    _check_strict(opts, plan)
    build = preview(plan, opts.build_strategy, jobs=opts.jobs)
    phases["build preview"] = time.perf_counter() - t0
    report = Report.from_plan(plan, flops, module_paths(cap.graph_module),
                              input_summary(cap.graph_module))
    report.phases = phases
    report.glue = {"requested": spec.glue, "glue": spec.resolved(), "mode": spec.mode,
                   "options": spec.options}
    if spec.planned() != spec.resolved():
        report.glue["note"] = (f"no GPU here: on a GPU host with Triton the model runs with "
                               f"{spec.planned()} glue")
    return DryRun(report, build)
