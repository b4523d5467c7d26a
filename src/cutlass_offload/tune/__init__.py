"""Tune (``--tune``): profile a few candidate kernels per distinct GEMM problem on
the GPU and keep the fastest, remembered in a persistent tuning cache.

    tune(plan, options) -> TuningReport        # .winners feeds select(..., tuned=)

For each distinct GEMM problem of the plan (select.tuning_id: the example's
sizes, dtypes, layouts, alignments, epilogue) not in the tuning cache:

1. candidates: at most 4 configs (select.candidate_kernels; the heuristic's first);
2. build: one profiling plan, one region per (problem, candidate), through the
   ordinary sharded build and its cache: each candidate kernel compiled once, and
   reused from the kernel index by the final build, which then compiles no GEMM;
3. profile: one subprocess for the batch (tune/runner.py, tune/profile.py): the
   library's region launchers on random GPU data, checked against a float32
   reference and timed with CUDA events; a crashing candidate is recorded and the
   rest rerun in a fresh process;
4. store: the winner (fastest correct candidate), the heuristic's tag and every
   result, per key, in the tuning cache (tune/cache.py).

Dynamic dimensions are tuned at the example (hint) size. A candidate that fails
to compile, is refused by can_implement, errs, computes a wrong result or
crashes is skipped and recorded; a problem where none runs keeps the heuristic's
kernel. Nothing here fails the compile except a missing GPU (DeviceError).
"""
from __future__ import annotations

import time
import warnings

from .. import build as build_stage
from ..emit import region_symbol
from ..errors import CutlassOffloadError, DeviceError
from ..ir import GemmRegion, Plan
from ..select import DEFAULT_NUM_SMS, candidate_kernels, tuning_id
from .cache import TuningCache, tuning_key
from .result import (
    CandidateResult,
    TunedProblem,
    TuningReport,
    config_from_dict,
    config_to_dict,
)
from .runner import profile_candidates

__all__ = ["TuningCache", "TuningReport", "gpu_identity", "tune"]


def gpu_identity(arch: str) -> tuple:
    """(GPU name, SM count, device index) of the current CUDA device.

    Raises DeviceError without a GPU, or with one that cannot run ``arch`` code."""
    import torch

    from ..runtime.library import check_device
    if not torch.cuda.is_available():
        raise DeviceError("--tune times kernels on the GPU and none is visible: compile "
                          "without --tune (the shape heuristic needs no GPU)")
    check_device(arch)
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return props.name, props.multi_processor_count, index


def _problem_spec(problem) -> dict:
    m = problem.m if problem.m is not None else problem.m_hint
    batch = problem.batch if problem.batch is not None else problem.batch_hint
    return {"m": m, "n": problem.n, "k": problem.k, "batch": batch, "dtype": problem.dtype,
            "layout_b": problem.layout_b, "a_batch_broadcast": problem.a_batch_broadcast,
            "epilogue": {f: getattr(problem.epilogue, f)
                         for f in ("bias", "activation", "residual", "post_activation")}}


def _from_record(key: str, tid: str, regions: int, rec: dict):
    """A TunedProblem from a cache record, or None when the record is unusable."""
    try:
        if rec.get("winner_config") is not None:
            config_from_dict(rec["winner_config"])       # still a valid config?
        cands = [CandidateResult(**c) for c in rec.get("candidates", [])]
        return TunedProblem(key, tid, regions, True, rec["heuristic"], rec.get("winner"),
                            rec.get("winner_config"), cands, rec.get("torch_us"))
    except (KeyError, TypeError, ValueError):
        return None


def tune(plan: Plan, options, *, cache: TuningCache | None = None, gpu: tuple | None = None,
         builder=build_stage.build, profiler=profile_candidates) -> TuningReport:
    """Profile the GEMM problems of ``plan`` missing from the tuning cache.

    options: the CompileOptions (arch resolved; num_sms as for select).
    gpu: (name, SM count, device index); None = the current CUDA device.
    builder / profiler: the build stage and tune.runner.profile_candidates (tests
    pass fakes). Returns a TuningReport whose ``winners`` go to select.
    Raises DeviceError without a suitable GPU.
    """
    from ..build.toolchain import cutlass_version
    t0 = time.perf_counter()
    arch = options.arch
    name, sms, device = gpu or gpu_identity(arch)
    cache = cache or TuningCache()
    version = cutlass_version()
    counts, problems = {}, {}
    for r in plan.regions:
        if isinstance(r, GemmRegion):
            tid = tuning_id(r.problem)
            counts[tid] = counts.get(tid, 0) + 1
            problems.setdefault(tid, r.problem)
    done, todo = {}, []
    for tid, problem in problems.items():
        key = tuning_key(tid, arch, version, name, sms)
        rec = cache.lookup(arch, name, key)
        hit = _from_record(key, tid, counts[tid], rec) if rec is not None else None
        if hit is not None:
            done[tid] = hit
            continue
        try:
            kernels = candidate_kernels(problem, arch, options.num_sms or DEFAULT_NUM_SMS[arch])
        except ValueError:
            continue                                  # select turns it into a fallback
        todo.append((tid, key, problem, kernels))
    report = TuningReport(gpu=name)
    if todo:
        _profile(todo, counts, arch, device, builder, profiler, report, done)
        records = {p.key: _record(p, arch, version, name, sms) for p in done.values()
                   if not p.cached and all(c.status != "not profiled" for c in p.candidates)}
        if records:
            try:
                cache.store(arch, name, records)
            except OSError as e:
                warnings.warn(f"cutlass_offload: tuning results not cached ({e})", RuntimeWarning)
    report.problems = [done[tid] for tid in problems if tid in done]
    report.seconds = time.perf_counter() - t0
    return report


def _profile(todo, counts, arch, device, builder, profiler, report, done):
    """Build every candidate of ``todo`` ((tuning id, key, problem, kernels) per
    problem) in one profiling plan, profile them, and fill ``done``."""
    regions, kernels, tags, owner = [], [], {}, {}
    for i, (_, _, problem, cands) in enumerate(todo):
        for j, k in enumerate(cands):
            rid = f"tune{i}_{j}"
            regions.append(GemmRegion(name=rid, form="linear", nodes=(rid,), a="a", b="b",
                                      problem=problem))
            kernels.append(k)
            tags[rid], owner[rid] = k.config.tag, (str(i), k)
    prof_plan = Plan(arch=arch, regions=tuple(regions), kernels=tuple(kernels), fallbacks=())
    results, torch_us = {}, {}
    try:
        built = builder(prof_plan, "sharded")
        report.build = built.to_dict()
        logs = {k: str(log) for k, log in built.failures}
        for rid, (_, k) in owner.items():
            if k.name in logs:
                results[rid] = CandidateResult(k.name, tags[rid], "compile failed", detail=logs[k.name])
        jobs = [{"id": r.name, "problem": owner[r.name][0], "symbol": region_symbol(r.name),
                 "kernel": k.name} for r, k in zip(built.plan.regions, built.plan.kernels)]
        specs = {str(i): _problem_spec(problem) for i, (_, _, problem, _) in enumerate(todo)}
        if jobs:
            got, torch_us = profiler(built.library, specs, jobs, tags, device=device)
            results.update(got)
    except CutlassOffloadError as e:                 # the candidate build itself failed
        for rid, (_, k) in owner.items():
            results.setdefault(rid, CandidateResult(k.name, tags[rid], "not profiled",
                                                    detail=str(e).splitlines()[0]))
    for i, (tid, key, _, cands) in enumerate(todo):
        rows = [results.get(f"tune{i}_{j}") or CandidateResult(k.name, k.config.tag, "not profiled")
                for j, k in enumerate(cands)]
        ok = [(c.us, j) for j, c in enumerate(rows) if c.status == "ok" and c.us is not None]
        best = min(ok)[1] if ok else None
        done[tid] = TunedProblem(
            key, tid, counts[tid], False, cands[0].config.tag,
            cands[best].config.tag if best is not None else None,
            config_to_dict(cands[best].config) if best is not None else None,
            rows, torch_us.get(str(i)))


def _record(p: TunedProblem, arch, version, gpu, sms) -> dict:
    from dataclasses import asdict
    return {"tuning_id": p.tuning_id, "arch": arch, "cutlass": version, "gpu": gpu, "num_sms": sms,
            "heuristic": p.heuristic, "winner": p.winner, "winner_config": p.winner_config,
            "candidates": [asdict(c) for c in p.candidates], "torch_us": p.torch_us,
            "created": time.time()}
