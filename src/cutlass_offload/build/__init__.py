"""Build: the emitted kernels and launchers -> ONE shared library, fast.

Strategies (CompileOptions.build_strategy):

* ``sharded`` (default): the distinct kernels go into balanced shards (build/shards.py)
  compiled in parallel to objects, each cached by content; launchers are their
  own small object, so a model change that reuses existing kernels recompiles no
  kernel; a kernel already compiled in any cached shard is reused from there. The
  objects are linked into one library, itself cached.
* ``single``: one translation unit, one nvcc invocation (the seed's way).
* ``per-region``: one module per region, compiled one after another, then linked
  (the old TVM way; each region's module repeats the header cost).

All three export the same symbols and run the same kernels. A kernel that fails
to compile (sharded, per-region) is isolated: only regions using it fall back.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from .. import integrity
from ..config import compiler_identity, knobs
from ..emit import (
    TranslationUnit,
    emit_info_unit,
    emit_kernels,
    emit_launchers,
    emit_library,
    emit_region_unit,
    emit_unit,
)
from ..errors import CompileError, DiskFullError
from ..ir import Plan
from . import toolchain
from .cache import DISK_FULL_HINT, BuildCache, cache_key
from .executor import CompileTask, LocalExecutor, ToolchainId, make_executor
from .jobs import Job, JobResult, mark_interrupted, mark_toolchain_failure, run_job, run_jobs
from .result import BuildResult, UnitReport
from .shards import choose_shards, estimate, header_compatible_groups, peak_memory

LIB_NAME = "libcutlass_offload.so"
SOURCE_NAME = "kernels.cu"
OBJ_NAME = "unit.o"
UNIT_NAME = "unit.cu"
SPEED_FILE = "build_speed.json"     # this machine's measured build speed, for ETAs (jobs.Progress)


def build(plan: Plan, strategy: str = "sharded", cache: BuildCache | None = None,
          jobs: int | None = None, executor=None) -> BuildResult:
    """Build ``plan``'s kernels and launchers into one shared library (cached).

    executor: who compiles each object (build/executor.py): None or "local" = this
    machine, "ray" = a Ray cluster (RAY_ADDRESS / a local one), or an executor
    object (e.g. ``RayExecutor(address)``). The library is always linked here, and
    the "single" strategy (one nvcc to a library) always compiles here.

    Raises ToolchainError without nvcc/CUTLASS; CompileError when nvcc fails on
    the whole library (single strategy), on the launchers or at link time, with the
    command, the log and the kept source; DiskFullError when the cache's disk fills
    (nothing of it is cached). In the other strategies a failing kernel only
    removes its regions from the returned plan.
    """
    if executor is None or isinstance(executor, str):
        executor = make_executor(executor or "local")
    if strategy not in ("single", "per-region", "sharded"):
        raise ValueError(f"unknown build strategy {strategy!r}")
    cache = cache or BuildCache()
    b = _Builder(plan, cache, jobs, executor)
    t0 = time.perf_counter()
    try:
        if strategy == "single":
            result = b.single()
        elif strategy == "per-region":
            # one after another, as TVM did; an explicit ``jobs`` compiles the modules
            # side by side (benchmarks/compile_time.py times each module that way)
            result = b.per_region(workers=jobs or 1)
        else:
            result = b.sharded()
    except OSError as e:
        if integrity.is_disk_full(e):      # e.g. a staging folder, a log, an index file
            raise integrity.disk_full(e, cache.root, DISK_FULL_HINT) from e
        raise
    result.seconds = time.perf_counter() - t0
    return result


class _Builder:
    def __init__(self, plan: Plan, cache: BuildCache, jobs, executor=None):
        self.plan, self.cache = plan, cache
        self.nvcc = toolchain.find_nvcc()
        self.identity = ToolchainId.here(self.nvcc, plan.arch)
        self.versions = (self.identity.nvcc_version, self.identity.cutlass_version, plan.arch)
        self.executor = executor or LocalExecutor(self.nvcc)
        self.jobs = jobs or self.executor.slots(plan.kernels)
        self._threads = 1              # nvcc -t of the CUTLASS units of the current _run
        self.sources = emit_kernels(plan)
        self._kernel_keys = {}          # kernel name -> index key (_kernel_key)
        self.kernels = {k.name: k for k in plan.kernels}
        # with the local executor, units without CUTLASS (the launchers) go to the host
        # compiler when nvcc's CUDA headers are found; else (a stand-in nvcc, a bare
        # wheel, a Ray build: the executor's compile; CUTLASS_OFFLOAD_HOST_LAUNCHERS=0)
        # to nvcc as before
        include = (toolchain.cuda_include_dir(self.nvcc)
                   if knobs().host_launchers and isinstance(self.executor, LocalExecutor) else None)
        self.host = (knobs().cxx, include, compiler_identity(knobs().cxx)) if include else None

    # -- keys ------------------------------------------------------------------
    def _unit_key(self, tu: TranslationUnit, cutlass=True) -> str:
        if not cutlass and self.host is not None:
            cmd = toolchain.host_compile_command("c++", "", UNIT_NAME, OBJ_NAME)
            return cache_key(tu.text, toolchain.flags_signature(cmd), self.host[2], *self.versions)
        cmd = toolchain.compile_command("nvcc", self.plan.arch, UNIT_NAME, OBJ_NAME, cutlass,
                                        flags=tu.flags)
        return cache_key(tu.text, toolchain.flags_signature(cmd), *self.versions)

    def _kernel_key(self, name: str) -> str:
        # a source's defines follow from its code (emit/gemm_sm90.py), so the code covers
        # them; its preamble blocks (our activation functors, the TMA driver) do not.
        # Memoized: _unit_serves asks for every kernel of each unit an index names
        if name not in self._kernel_keys:
            s = self.sources[name]
            cmd = toolchain.compile_command("nvcc", self.plan.arch, UNIT_NAME, OBJ_NAME, flags=s.nvcc_flags)
            self._kernel_keys[name] = cache_key(s.code, "\n".join(s.includes), "\n".join(s.preamble),
                                                toolchain.flags_signature(cmd), *self.versions)
        return self._kernel_keys[name]

    def _index_path(self, name: str) -> Path:
        return self.cache.root / "index" / f"{self._kernel_key(name)[:32]}.json"

    # -- objects ---------------------------------------------------------------
    def _object_job(self, name: str, prefix: str, tu: TranslationUnit, cutlass=True):
        """(UnitReport, None) on a cache hit, else (None, Job) that builds it."""
        key = self._unit_key(tu, cutlass)
        hit = self.cache.lookup("obj", prefix, key, OBJ_NAME)
        if hit is not None:
            d, meta = hit
            return UnitReport(name, tu.kernels, 0.0, True, meta.get("ok", True),
                              meta.get("peak_rss_mb", 0.0), str(d / UNIT_NAME),
                              str(d / "nvcc.log")), None
        job = Job(name, [], tu.kernels, estimate([self._kernel(k) for k in tu.kernels]) if tu.kernels else 1.0)
        job.unit = (prefix, key, tu, cutlass)
        return None, job

    def _kernel(self, name):
        return self.kernels[name]

    def _compile_object(self, job: Job) -> JobResult:
        """Worker: lock the key, double-check, compile, publish (success or failure)."""
        prefix, key, tu, cutlass = job.unit
        with self.cache.lock("obj", prefix, key):
            hit = self.cache.lookup("obj", prefix, key, OBJ_NAME)
            if hit is not None:                       # another process built it meanwhile
                d, meta = hit
                job.entry = d
                return JobResult(job.name, meta.get("ok", True), 0.0, 0, "", tu.kernels)
            staging = self.cache.staging("obj")
            try:
                _write(staging / UNIT_NAME, tu.text)
                job.log_path = staging / "nvcc.log"
                if not cutlass and self.host is not None:
                    # host code only (the launchers): the host compiler, well under a second
                    cxx, include, _ = self.host
                    job.cmd = toolchain.host_compile_command(cxx, include, str(staging / UNIT_NAME),
                                                             str(staging / OBJ_NAME))
                    res = run_job(Job(job.name, job.cmd, tu.kernels, log_path=job.log_path))
                    res.executor = "local (host compiler)"
                else:
                    kernels = [self._kernel(k) for k in tu.kernels]
                    task = CompileTask.make(job.name, tu.text, self.plan.arch, cutlass, self.identity,
                                            peak_memory(kernels), tu.kernels, job.estimate,
                                            self._threads if cutlass else 1, tu.flags)
                    # only "run nvcc on this source" is pluggable: lock, lookup and publish stay here
                    res, job.cmd = self.executor.compile(task, staging)
                _raise_if_disk_full(res, staging)
                keep = self.cache.root / "failed" / f"{prefix}.{key[:16]}"
                # transient, or the toolchain's fault: report, but never cache as a failure
                if mark_interrupted(res) or mark_toolchain_failure(res):
                    job.entry = _keep_failed(staging, keep, res.log)
                    return res
                meta = {"ok": res.ok, "kernels": list(tu.kernels), "seconds": res.seconds,
                        "peak_rss_mb": res.peak_rss / 2**20, "command": job.cmd,
                        "executor": res.executor}
                job.entry = self.cache.publish("obj", prefix, key, staging,
                                               OBJ_NAME if res.ok else None, meta)
                if res.ok and not tu.symbols:     # kernel-only objects are reusable
                    for k in tu.kernels:
                        self._write_index(k, prefix, key)
                if res.ok:                        # an interrupted attempt's leftovers are stale now
                    shutil.rmtree(keep, ignore_errors=True)
                return res
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def _write_index(self, kernel: str, prefix: str, key: str):
        self.cache.write_index(self._index_path(kernel).name,
                               {"kernel": kernel, "prefix": prefix, "key": key})

    def _indexed_unit(self, kernel: str):
        """(prefix, key) of the unit the index names for ``kernel``'s current code, or None."""
        try:
            ref = json.loads(self._index_path(kernel).read_text())
            return ref["prefix"], ref["key"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _cached_shard_of(self, kernel: str):
        """The committed object of any earlier shard that compiled ``kernel``."""
        ref = self._indexed_unit(kernel)
        if ref is None:
            return None
        hit = self.cache.lookup("obj", ref[0], ref[1], OBJ_NAME)
        if hit is None or not hit[1].get("ok", True):
            return None
        return ref[0], ref[1], hit

    def _unit_serves(self, found, claimed: set) -> bool:
        """Whether a cached unit (``_cached_shard_of``) may be linked: every kernel of
        this plan it holds has its current key indexed to it, and it shares no kernel
        with a unit already taken. A kernel's code can change under the same name (an
        epilogue functor rewritten): the unit's copy is then stale, and it would also
        clash at link time with the fresh unit that compiles the new code; two units
        holding one symbol fail the link."""
        prefix, key, (_, meta) = found
        kernels = meta.get("kernels", ())
        if claimed.intersection(kernels):
            return False
        return all(self._indexed_unit(k) == (prefix, key) for k in kernels if k in self.sources)

    def _run(self, pending: list, desc: str, workers=None, heavy_limit=None) -> list:
        """Compile pending jobs, at most ``heavy_limit`` CUTLASS units at once (None:
        ``workers``); UnitReports in order."""
        workers = workers or self.jobs
        self._threads = 1
        if isinstance(self.executor, LocalExecutor):
            # cores no job uses go to nvcc's -t: with fewer CUTLASS units than cores
            # (few kernels, or few cores: choose_shards) each runs its host and
            # device passes side by side, as the single strategy's -t0 does
            heavy = sum(1 for j in pending if j.unit[3])
            self._threads = knobs().nvcc_threads or max(1, _cores() // max(1, min(heavy, workers)))
        local = isinstance(self.executor, LocalExecutor)     # Ray's hosts are elsewhere
        results = run_jobs(pending, workers, desc, runner=self._compile_object,
                           heavy=lambda j: j.unit[3], heavy_limit=heavy_limit or workers,
                           speed_file=self.cache.root / SPEED_FILE if local else None)
        return [UnitReport(j.name, j.unit[2].kernels, r.seconds, r.seconds == 0.0, r.ok,
                           r.peak_rss / 2**20, str(j.entry / UNIT_NAME), str(j.entry / "nvcc.log"),
                           "" if r.seconds == 0.0 else r.executor)
                for j, r in zip(pending, results)]

    # -- strategies --------------------------------------------------------------
    def reused_units(self) -> list:
        """[(prefix, entry folder, meta)] of units earlier builds compiled that serve
        kernels of this plan (the kernel index, ``_cached_shard_of`` / ``_unit_serves``),
        in the plan's kernel order. The sharded build links them; the dry run lists them."""
        units, reused, claimed = [], set(), set()
        for name in self.sources:
            if name in reused:
                continue
            found = self._cached_shard_of(name)
            if found and self._unit_serves(found, claimed):
                prefix, _, (d, meta) = found
                claimed.update(meta.get("kernels", ()))
                reused.update(k for k in meta.get("kernels", ()) if k in self.sources)
                units.append((prefix, d, meta))
        return units

    def shard_units(self, shards) -> list:
        """[(prefix, TranslationUnit)] of kernel groups ``shards``."""
        # the header enters the unit's cache key: no shard index (it depends on which
        # shards this build has left to compile, so a cached shard would miss)
        return [(shard_name(shard), emit_unit([self.sources[k.name] for k in shard],
                                              f"shard of {len(shard)} kernels for {self.plan.arch}"))
                for shard in shards]

    def todo_shards(self, reused) -> list:
        """The planned shards of this plan's kernels that ``reused`` (reused_units) lacks."""
        held = {k for _, _, meta in reused for k in meta.get("kernels", ())}
        todo = [k for k in {k.name: k for k in self.plan.kernels}.values() if k.name not in held]
        return choose_shards(todo, self.jobs)

    def sharded(self, shards=None, workers=None, strategy="sharded") -> BuildResult:
        """shards: explicit kernel groups (else planned); workers: parallel nvcc jobs."""
        units, pending = [], []
        reused = self.reused_units() if shards is None else []     # compiled by earlier builds
        for prefix, d, meta in reused:
            # named as a fresh unit is (the cache folder's name adds the key, which the
            # output folder's src/ file name adds again)
            units.append(UnitReport(prefix, tuple(meta.get("kernels", ())), 0.0, True, True,
                                    meta.get("peak_rss_mb", 0.0), str(d / UNIT_NAME)))
        for prefix, tu in self.shard_units(shards if shards is not None else self.todo_shards(reused)):
            report, job = self._object_job(prefix, prefix, tu)
            if report:
                units.append(report)
            else:
                pending.append(job)
        launchers, heavy_limit = None, None
        if strategy == "sharded" and pending:
            # the launchers (no CUTLASS headers, seconds) compile beside the shards in a
            # slot of their own instead of after them; only a failed kernel redoes them
            launchers, job = self._object_job("launchers", "launchers", emit_launchers(self.plan),
                                              cutlass=False)
            if job is not None:
                pending.append(job)
                workers = (workers or self.jobs) + 1
                heavy_limit = workers - 1      # that slot stays the launchers' (jobs.run_jobs)
        units += self._run(pending, "compiling shards", workers, heavy_limit)
        if launchers is None and pending and pending[-1].name == "launchers":
            launchers = units.pop()
        failed = self._isolate([u for u in units if not u.ok])
        units = [u for u in units if u.ok] + failed["retried"]
        plan = self._pruned(failed["kernels"])
        if launchers is None or not launchers.ok or failed["kernels"]:
            launchers = self._small_object("launchers", emit_launchers(plan))
        units.append(launchers)
        return self._finish(units, plan, failed["kernels"], strategy)

    def _isolate(self, bad_units) -> dict:
        """Recompile the kernels of failed multi-kernel shards one by one, so one bad
        kernel does not take its neighbours down. Returns the retried units that
        built and the kernels that fail alone, with their logs."""
        pending, done, kernels = [], [], []
        for u in bad_units:
            if len(u.kernels) == 1:
                kernels.append((u.kernels[0], u.log))
                continue
            for k in u.kernels:
                tu = emit_unit([self.sources[k]], f"{k} alone (isolating a failed shard)")
                # the cache prefix stays "alone" (entries of earlier versions still hit)
                report, job = self._object_job(f"alone_{k}", "alone", tu)
                if report is None:
                    pending.append(job)
                elif report.ok:
                    done.append(report)
                else:
                    kernels.append((k, report.log))
        done += self._run(pending, "isolating failures") if pending else []
        kernels += [(u.kernels[0], u.log) for u in done if not u.ok]
        return {"retried": [u for u in done if u.ok], "kernels": kernels}

    def per_region(self, workers: int = 1) -> BuildResult:
        units, pending = [], []
        for i, region in enumerate(self.plan.regions):
            tu = emit_region_unit(self.plan, i, self.sources)
            report, job = self._object_job(region.name, "region", tu)
            if report:
                units.append(report)
            else:
                pending.append(job)
        units += self._run(pending, "compiling regions", workers=workers)
        failures = [(u.kernels[0], u.log) for u in units if not u.ok]
        units = [u for u in units if u.ok]
        plan = self._pruned(failures)
        units.append(self._small_object("library_info", emit_info_unit(plan)))
        return self._finish(units, plan, failures, "per-region")

    def single_source(self) -> tuple:
        """(the one source of the single strategy, its cache prefix, its cache key)."""
        src = emit_library(self.plan)
        cmd = toolchain.nvcc_command("nvcc", self.plan.arch, SOURCE_NAME, LIB_NAME, 0, src.flags)
        key = cache_key(src.text, toolchain.flags_signature(cmd), *self.versions)
        return src, f"lib_{self.plan.arch}_{len(src.kernel_spans)}k_single", key

    def single(self) -> BuildResult:
        groups = header_compatible_groups(self.plan.distinct_kernels)
        if len(groups) > 1:
            # CUTLASS cannot hold both in one TU: one unit per group, one after another
            return self.sharded(shards=groups, workers=1, strategy="single")
        src, prefix, key = self.single_source()
        with self.cache.lock("lib", prefix, key):
            hit = self.cache.lookup("lib", prefix, key, LIB_NAME)
            if hit is not None and not hit[1].get("ok", True):
                d, meta = hit
                raise _failure(src, self.plan, d, meta.get("command", []),
                               (d / "nvcc.log").read_text(errors="replace"))
            if hit is not None:
                d, meta = hit
                unit = UnitReport("single", src.kernels, 0.0, True, True, meta.get("peak_rss_mb", 0.0),
                                  str(d / SOURCE_NAME))
                return BuildResult(d / LIB_NAME, self.plan, "single", 0.0, 1, [unit])
            staging = self.cache.staging("lib")
            try:
                _write(staging / SOURCE_NAME, src.text)
                job = Job("single", toolchain.nvcc_command(
                    self.nvcc, self.plan.arch, str(staging / SOURCE_NAME), str(staging / LIB_NAME),
                    knobs().nvcc_threads, src.flags),
                    src.kernels, log_path=staging / "nvcc.log")
                res = run_jobs([job], 1, "compiling one unit")[0]
                _raise_if_disk_full(res, staging)
                if mark_interrupted(res):
                    raise CompileError(f"nvcc was killed: {res.log.strip().splitlines()[-1]}",
                                       command=job.cmd, log_path=job.log_path,
                                       source_path=staging / SOURCE_NAME, kernels=src.kernels)
                if mark_toolchain_failure(res):     # not the source's failure: kept, not cached
                    keep = _keep_failed(staging, self.cache.root / "failed" / f"{prefix}.{key[:16]}",
                                        res.log)
                    raise _failure(src, self.plan, keep, job.cmd, res.log)
                meta = {"ok": res.ok, "command": job.cmd, "seconds": res.seconds,
                        "peak_rss_mb": res.peak_rss / 2**20, "kernels": list(src.kernels)}
                d = self.cache.publish("lib", prefix, key, staging, LIB_NAME if res.ok else None, meta)
                if not res.ok:
                    raise _failure(src, self.plan, d, job.cmd, res.log)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        unit = UnitReport("single", src.kernels, res.seconds, False, True, res.peak_rss / 2**20,
                          str(d / SOURCE_NAME))
        return BuildResult(d / LIB_NAME, self.plan, "single", 0.0, 1, [unit])

    # -- launchers and link ----------------------------------------------------------
    def _pruned(self, failures) -> Plan:
        bad = {k for k, _ in failures}
        if not bad:
            return self.plan
        logs = dict(failures)
        return self.plan.keep(lambda r, k: k.name not in bad,
                              lambda r, k: f"kernel {k.name} failed to compile (log: {logs[k.name]})")

    def _small_object(self, name, tu) -> UnitReport:
        report, job = self._object_job(name, name, tu, cutlass=False)
        if report is None:
            report = self._run([job], f"compiling {name}")[0]
        if not report.ok:
            what = "the host compiler" if "host compiler" in report.executor else "nvcc"
            raise CompileError(f"{what} failed on the {name}", command=getattr(job, "cmd", None) or [],
                               log_path=report.log, source_path=report.source)
        return report

    def link_key(self, plan, entries) -> tuple:
        """(cache prefix, key) of the library linked from the object entries named
        ``entries`` (their cache folders' names, sorted)."""
        cmd_sig = toolchain.flags_signature(toolchain.link_command("nvcc", plan.arch, [], LIB_NAME))
        return f"lib_{plan.arch}_{len(plan.distinct_kernels)}k", cache_key(*entries, cmd_sig, *self.versions)

    def _finish(self, units, plan, failures, strategy) -> BuildResult:
        """Link every unit's object into the library (cached by the objects' keys)."""
        objs = sorted({str(Path(u.source).parent / OBJ_NAME) for u in units})
        keys = sorted(Path(p).parent.name for p in objs)
        prefix, key = self.link_key(plan, keys)
        link_seconds = 0.0
        hit = self.cache.lookup("lib", prefix, key, LIB_NAME)
        if hit is None:
            with self.cache.lock("lib", prefix, key):
                hit = self.cache.lookup("lib", prefix, key, LIB_NAME)
                if hit is None:
                    staging = self.cache.staging("lib")
                    try:
                        cmd = toolchain.link_command(self.nvcc, plan.arch, objs, str(staging / LIB_NAME))
                        job = Job("link", cmd, log_path=staging / "link.log")
                        res = run_job(job)
                        link_seconds = res.seconds
                        _raise_if_disk_full(res, staging)
                        if not res.ok:
                            raise CompileError(f"linking failed: {res.log.strip()[:300]}", command=cmd,
                                               log_path=job.log_path, source_path=objs[0])
                        self.cache.publish("lib", prefix, key, staging, LIB_NAME,
                                           {"ok": True, "objects": keys, "seconds": link_seconds})
                    finally:
                        shutil.rmtree(staging, ignore_errors=True)
                    hit = self.cache.lookup("lib", prefix, key, LIB_NAME)
        d, _ = hit
        return BuildResult(d / LIB_NAME, plan, strategy, 0.0, self.jobs, units, link_seconds, failures)


_NAME_MAX = 150      # the unit name prefixes a cache folder's name (255 bytes at most)


def shard_name(kernels) -> str:
    """A unit's name, saying what it holds: ``shard_<family>_<kind>_<dtype>_<n>k``
    per (family, kind, dtype) present, joined by "+", most kernels first, e.g.
    ``shard_sm90_gemm_f16_4k+sm90_attention_f16_1k+rowwise_layer_norm_f16_1k``.
    Families: sm90 (CUTLASS 3.x), sm80 (2.x, also on sm_90a), rowwise (norms), nhwc
    (group norm), dw (depthwise conv). A shard of one kind keeps the name earlier versions gave it (the
    name prefixes its cache entry, so those entries still hit)."""
    counts = {}
    for k in kernels:
        fam = {"cutlass3x_sm90": "sm90", "rowwise_norm": "rowwise",
               "nhwc_group_norm": "nhwc", "direct_depthwise": "dw"}.get(k.config.family, "sm80")
        kind = {"conv2d_fprop": "conv"}.get(k.kind, k.kind)       # gemm, attention, layer_norm, ...
        token = f"{fam}_{kind}_{k.dtype}"
        counts[token] = counts.get(token, 0) + 1
    tokens = [f"{t}_{n}k" for t, n in sorted(counts.items(), key=lambda tn: (-tn[1], tn[0]))]
    name = "shard_" + "+".join(tokens)
    while len(name) > _NAME_MAX and len(tokens) > 1:
        tokens.pop()
        rest = sum(counts.values()) - sum(int(t.rsplit("_", 1)[1][:-1]) for t in tokens)
        name = "shard_" + "+".join(tokens) + f"+{rest}k_more"
    return name


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _write(path: Path, text: str):
    """Write a generated file; a full disk becomes a clear DiskFullError."""
    try:
        path.write_text(text)
    except OSError as e:
        if integrity.is_disk_full(e):
            raise integrity.disk_full(e, path, DISK_FULL_HINT) from e
        raise


# what nvcc and its tools print when a write fails for space (strerror of ENOSPC / EDQUOT)
_DISK_FULL_LOG = re.compile(r"No space left on device|Disk quota exceeded")


def _raise_if_disk_full(res: JobResult, staging: Path) -> None:
    """A compile or link that failed because the disk filled is no compile error of
    its kernels (and must not be cached as one): raise DiskFullError instead."""
    m = None if res.ok else _DISK_FULL_LOG.search(res.log or "")
    if m:                    # the staging folder is removed: name the cache folder it was in
        raise DiskFullError(staging.parent, f'{res.name} failed with "{m.group(0)}"; {DISK_FULL_HINT}')


_LINE = re.compile(rf"{re.escape(SOURCE_NAME)}\((\d+)\)|line (\d+) of \S*{re.escape(SOURCE_NAME)}")


def _keep_failed(staging: Path, keep: Path, log: str) -> Path:
    """Move a failed compile's staging folder (its source) to ``keep`` under the cache's
    failed/ folder, never an entry, with its log: a failure not to cache (interrupted,
    or the toolchain's). Returns ``keep``."""
    shutil.rmtree(keep, ignore_errors=True)
    keep.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, keep)
    (keep / "nvcc.log").write_text(log)
    return keep


def _failure(src, plan, folder: Path, cmd, log) -> CompileError:
    lines = {int(a or b) for a, b in _LINE.findall(log)}
    kernels = sorted({k for k in (src.kernel_at_line(n) for n in lines) if k})
    if not kernels:
        kernels = list(src.kernels)
    regions = [r.name for r, k in plan.pairs if k.name in kernels]
    first = next((l for l in log.splitlines() if "error" in l), log.strip()[:300])
    return CompileError(f"nvcc failed: {first}", command=cmd, log_path=folder / "nvcc.log",
                        source_path=folder / SOURCE_NAME, kernels=kernels, regions=regions)
