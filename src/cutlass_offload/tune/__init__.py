"""Tune (``--tune``): profile candidate kernels and launch knobs per distinct GEMM
problem on the GPU and keep the fastest, remembered in a persistent tuning cache.

    tune(plan, options) -> TuningReport        # .winners feeds select(..., tuned=)

For each distinct GEMM problem of the plan (select.tuning_id: the example's
sizes, dtypes, layouts, alignments, epilogue) not in the tuning cache:

1. rank (CUTLASS 3.x problems, ``search="full"``): every plausible config of the
   sm90 search space (select/sm90.py SPACE) on a proxy of the problem, the same
   shape with a plain epilogue in fp16 (the mainloop decides the ranking; proxies
   of bf16 and fused problems share kernels, so the search compiles each config
   once per B layout and alignment, not once per epilogue and dtype); a stream-K
   config by the best of its decompositions (sm90.decomposition_variants);
2. final: the heuristic's kernel and the ``TOP`` best-ranked configs, built with
   the problem's own epilogue and dtype, each timed with its launch knobs; the
   ``KNOB_TOP`` fastest and every stream-K kernel are retimed with every launch variant
   (sm90.launch_variants: raster order, swizzle, split-K / stream-K
   decomposition: no recompile), then the fastest of all with PDL on. CUTLASS
   2.x problems profile their (at most four) candidates in this step only;
3. build through the ordinary sharded build and its cache (a kernel compiled for
   the search is reused by the final build), profile in subprocesses
   (tune/runner.py, tune/profile.py: random GPU data, checked against a float32
   reference, CUDA-graph timing; a crashing candidate is recorded and the rest go
   on in a fresh process);
4. store: the winner (fastest correct config and launch), the heuristic's tag
   and every result, per key, in the tuning cache (tune/cache.py).

``search="heuristic"`` profiles the heuristic's kernel alone (a measurement, not
a tuning: benchmarks/kernels_bench.py). ``search="fitted"`` ranks only the heuristic's
(the learned table's) choice against the tiles fitted to the problem's waves
(sm90.fitted_configs), then goes on as a full search: it adds those tiles to a
table a full search made, at a fraction of the compiles; like "heuristic" it
neither reads nor fills the tuning cache. Dynamic dimensions are tuned at the example
(hint) size. A candidate that fails to compile, is refused, errs, computes a wrong
result or crashes is skipped and recorded; a problem where none runs keeps the
heuristic's kernel. Nothing here fails the compile except a missing GPU
(DeviceError).
"""
from __future__ import annotations

import time
import warnings
from dataclasses import asdict, replace

from .. import build as build_stage
from ..abi import region_symbol
from ..errors import CutlassOffloadError, DeviceError
from ..ir import GemmEpilogue, GemmKernel, GemmLaunch, GemmRegion, Plan
from ..select import DEFAULT_NUM_SMS, candidate_kernels, choose_kernel, kernel_tag, sm90, tuning_id
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

TOP = 3          # ranked configs built with the problem's own epilogue
KNOB_TOP = 2     # of those, how many are retimed with every launch variant
SEARCHES = ("full", "fitted", "heuristic")


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


def problem_spec(problem) -> dict:
    """The profiler's description of an ir.GemmProblem (tune/profile.py Operands):
    m and batch at their example sizes when dynamic, n, k, dtype, layout_b,
    a_batch_broadcast and the epilogue's fields."""
    m = problem.m if problem.m is not None else problem.m_hint
    batch = problem.batch if problem.batch is not None else problem.batch_hint
    return {"m": m, "n": problem.n, "k": problem.k, "batch": batch, "dtype": problem.dtype,
            "layout_b": problem.layout_b, "layout_a": problem.layout_a,
            "a_batch_broadcast": problem.a_batch_broadcast,
            "epilogue": {f: getattr(problem.epilogue, f)
                         for f in ("bias", "activation", "residual", "post_activation", "glu")}}


def _from_record(key: str, tid: str, regions: int, rec: dict):
    """A TunedProblem from a cache record, or None when the record is unusable."""
    try:
        if rec.get("winner_config") is not None:
            config_from_dict(rec["winner_config"])       # still a valid config?
        cands = [CandidateResult(**c) for c in rec.get("candidates", [])]
        return TunedProblem(key, tid, regions, True, rec["heuristic"], rec.get("winner"),
                            rec.get("winner_config"), cands, rec.get("torch_us"),
                            winner_launch=rec.get("winner_launch"))
    except (KeyError, TypeError, ValueError):
        return None


def tune(plan: Plan, options, *, cache: TuningCache | None = None, gpu: tuple | None = None,
         builder=build_stage.build, profiler=profile_candidates, search: str = "full") -> TuningReport:
    """Profile the GEMM problems of ``plan`` missing from the tuning cache.

    options: the CompileOptions (arch resolved; num_sms as for select).
    gpu: (name, SM count, device index); None = the current CUDA device.
    builder / profiler: the build stage and tune.runner.profile_candidates (tests
    pass fakes). search: "full" (the module docstring), "fitted" (the heuristic's
    choice against the wave-fitted tiles; nothing cached) or "heuristic" (time the
    heuristic's kernel only; nothing is cached). Returns a TuningReport whose
    ``winners`` go to select. Raises DeviceError without a suitable GPU,
    ValueError for an unknown search.
    """
    from ..build.toolchain import cutlass_version
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {SEARCHES}, got {search!r}")
    t0 = time.perf_counter()
    arch = options.arch
    name, sms, device = gpu or gpu_identity(arch)
    cache = cache or TuningCache()
    version = cutlass_version()
    num_sms = options.num_sms or DEFAULT_NUM_SMS[arch]
    counts, problems = {}, {}
    for r in plan.regions:
        if isinstance(r, GemmRegion):
            tid = tuning_id(r.problem)
            counts[tid] = counts.get(tid, 0) + 1
            problems.setdefault(tid, r.problem)
    done, todo = {}, []
    for tid, problem in problems.items():
        key = tuning_key(tid, arch, version, name, sms)
        rec = cache.lookup(arch, name, key) if search == "full" else None
        hit = _from_record(key, tid, counts[tid], rec) if rec is not None else None
        if hit is not None:
            done[tid] = hit
            continue
        try:
            choose_kernel(problem, arch, num_sms)
        except ValueError:
            continue                                  # select turns it into a fallback
        todo.append((tid, key, problem))
    report = TuningReport(gpu=name)
    if todo:
        ctx = _Context(arch, num_sms, device, builder, profiler, report)
        ranking = _rank(todo, ctx, search) if search != "heuristic" else {}
        _final(todo, counts, ranking, ctx, done, search)
        records = {p.key: _record(p, arch, version, name, sms) for p in done.values()
                   if not p.cached and all(c.status != "not profiled" for c in p.candidates)}
        if records and search == "full":
            try:
                cache.store(arch, name, records)
            except OSError as e:
                warnings.warn(f"cutlass_offload: tuning results not cached ({e})", RuntimeWarning)
    report.problems = [done[tid] for tid in problems if tid in done]
    report.seconds = time.perf_counter() - t0
    return report


class _Context:
    def __init__(self, arch, num_sms, device, builder, profiler, report):
        self.arch, self.num_sms, self.device = arch, num_sms, device
        self.builder, self.profiler, self.report = builder, profiler, report


def _proxy(problem):
    """The plain-epilogue fp16 problem of the same shape, layout and alignment."""
    dtype = "f16" if problem.dtype in ("f16", "bf16") else problem.dtype
    return replace(problem, epilogue=GemmEpilogue(), dtype=dtype)


def _rank(todo, ctx, search="full") -> dict:
    """{proxy tuning id: [KernelConfig, ...] fastest first} for the 3.x problems of
    ``todo`` (step 1 of the module docstring; ``search`` "fitted": the heuristic's
    config and the fitted tiles only); the rows go to report.ranking."""
    proxies = {}
    for _, _, problem in todo:
        if choose_kernel(problem, ctx.arch, ctx.num_sms).config.family != "cutlass3x_sm90":
            continue
        proxy = _proxy(problem)
        proxies.setdefault(tuning_id(proxy), proxy)
    jobs = []
    for pid, (ptid, proxy) in enumerate(proxies.items()):
        space = (sm90.search_space(proxy, ctx.num_sms) if search == "full" else
                 (sm90.choose(proxy, ctx.num_sms)[0],) + sm90.fitted_configs(proxy, ctx.num_sms))
        for config in dict.fromkeys(space):
            jobs.append((str(pid), proxy, _kernel(proxy, ctx.arch, config), "decompositions"))
    # stream-K kernels are ranked on their best decomposition (sm90.decomposition_variants)
    results, _, extra = _build_and_profile(jobs, {str(i): p for i, p in enumerate(proxies.values())},
                                           ctx, knob_search={"top": 0, "pdl": False}, phase="rank")
    ranking = {}
    for pid, ptid in enumerate(proxies):
        rows = [(c, k) for (p, _, k, _), c in zip(jobs, results) if p == str(pid)]
        by_name = {k.name: k for _, k in rows}
        rows += [(c, by_name[c.kernel]) for c in extra.get(str(pid), []) if c.kernel in by_name]
        ctx.report.ranking[ptid] = [asdict(c) for c, _ in rows]
        best = {}
        for c, k in rows:
            if c.status == "ok" and c.us and c.us < best.get(k.name, (float("inf"),))[0]:
                best[k.name] = (c.us, k.config)
        ranking[ptid] = [config for _, config in sorted(best.values(), key=lambda t: t[0])]
    return ranking


def _final(todo, counts, ranking, ctx, done, search):
    """Step 2: each problem's own kernels (the heuristic's first), knob search."""
    jobs, specs, owners = [], {}, []
    for i, (tid, key, problem) in enumerate(todo):
        first = choose_kernel(problem, ctx.arch, ctx.num_sms)
        kernels = [first]
        if search != "heuristic":
            if first.config.family == "cutlass3x_sm90":
                ranked = ranking.get(tuning_id(_proxy(problem)), [])
                # ranked on the plain proxy: a GLU problem passes over N-split configs
                kernels += [_kernel(problem, ctx.arch, c) for c in ranked[:TOP]
                            if c != first.config and sm90.takes(problem, c)]
            else:
                kernels += [k for k in candidate_kernels(problem, ctx.arch, ctx.num_sms)[1:]]
        specs[str(i)] = problem
        owners.append((tid, key, first, len(jobs), len(kernels)))
        for k in kernels:
            knobs = search != "heuristic" and k.config.family == "cutlass3x_sm90"
            jobs.append((str(i), problem, k, knobs))
    knob_search = {"top": KNOB_TOP, "pdl": True} if search != "heuristic" else None
    results, torch_us, extra = _build_and_profile(jobs, specs, ctx, knob_search, phase="final")
    for i, (tid, key, first, start, n) in enumerate(owners):
        rows = results[start:start + n] + extra.get(str(i), [])
        ok = [(c.us, j) for j, c in enumerate(rows) if c.status == "ok" and c.us is not None]
        best = rows[min(ok)[1]] if ok else None
        configs = {k.name: k.config for _, _, k, _ in jobs[start:start + n]}
        config = configs[best.kernel] if best is not None else None
        done[tid] = TunedProblem(
            key, tid, counts[tid], False, _tag(first.config.tag, asdict(first.launch)),
            best.tag if best is not None else None,
            config_to_dict(config) if config is not None else None,
            rows, torch_us.get(str(i)),
            winner_launch=(best.launch or {}) if best is not None else None)


def _tag(config_tag: str, launch: dict | None) -> str:
    return kernel_tag(config_tag, GemmLaunch(**(launch or {})))


def _kernel(problem, arch, config) -> GemmKernel:
    return replace(choose_kernel(problem, arch), config=config, launch=sm90.DEFAULT_LAUNCH)


def _build_and_profile(jobs, specs, ctx, knob_search, phase) -> tuple:
    """Build one profiling plan of ``jobs`` ((problem id, problem, kernel, knobs)
    each; knobs: False, True (sm90.launch_variants) or "decompositions"
    (sm90.decomposition_variants); a stream-K kernel's variants are timed whatever
    its default launch's time) and profile it. Returns ([CandidateResult per job, in order],
    {problem id: PyTorch us}, {problem id: [CandidateResult of its launch-knob
    variants]})."""
    regions, kernels, tags, owner = [], [], {}, {}
    for j, (pid, problem, k, _) in enumerate(jobs):
        rid = f"{phase}{pid}_{j}"
        regions.append(GemmRegion(name=rid, form="linear", nodes=(rid,), a="a", b="b",
                                  problem=problem))
        kernels.append(k)
        tags[rid], owner[rid] = _tag(k.config.tag, asdict(k.launch)), j
    prof_plan = Plan(arch=ctx.arch, regions=tuple(regions), kernels=tuple(kernels), fallbacks=())
    results, torch_us = {}, {}
    try:
        built = ctx.builder(prof_plan, "sharded")
        ctx.report.build.setdefault("phases", {})[phase] = built.to_dict()
        logs = {k: str(log) for k, log in built.failures}
        for rid, j in owner.items():
            k = jobs[j][2]
            if k.name in logs:
                results[rid] = CandidateResult(k.name, tags[rid], "compile failed", detail=logs[k.name])
        prof_jobs = []
        for r, k in built.plan.pairs:
            pid, problem, _, knobs = jobs[owner[r.name]]
            job = {"id": r.name, "problem": pid, "symbol": region_symbol(r.name), "kernel": k.name,
                   "launch": asdict(k.launch)}
            variants = (() if not knobs else
                        sm90.decomposition_variants(k.config, problem) if knobs == "decompositions"
                        else sm90.launch_variants(k.config, problem, ctx.num_sms))
            if variants:
                job["variants"] = [asdict(v) for v in variants]
            if variants and k.config.tile_scheduler == "stream_k":
                job["always_variants"] = True    # its default launch may not be its best
                                                 # decomposition: retimed whatever its time
            prof_jobs.append(job)
        if prof_jobs:
            got, torch_us = ctx.profiler(built.library, {p: problem_spec(s) for p, s in specs.items()},
                                         prof_jobs, tags, device=ctx.device, knob_search=knob_search)
            results.update(got)
    except CutlassOffloadError as e:                 # the candidate build itself failed
        for rid, j in owner.items():
            k = jobs[j][2]
            results.setdefault(rid, CandidateResult(k.name, tags[rid], "not profiled",
                                                    detail=str(e).splitlines()[0]))
    ordered = []
    for rid, j in owner.items():
        k = jobs[j][2]
        ordered.append(results.get(rid) or CandidateResult(k.name, tags[rid], "not profiled"))
    variants = {}
    for rid, c in results.items():
        if "@" in rid:
            variants.setdefault(jobs[owner[rid.split("@")[0]]][0], []).append(c)
    return ordered, torch_us, variants


def _record(p: TunedProblem, arch, version, gpu, sms) -> dict:
    return {"tuning_id": p.tuning_id, "arch": arch, "cutlass": version, "gpu": gpu, "num_sms": sms,
            "heuristic": p.heuristic, "winner": p.winner, "winner_config": p.winner_config,
            "winner_launch": p.winner_launch,
            "candidates": [asdict(c) for c in p.candidates], "torch_us": p.torch_us,
            "created": time.time()}
