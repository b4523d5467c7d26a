"""What ``build`` would do with a plan, without building: the translation units its
strategy makes, each with whether the build cache already holds its object, and
whether the linked library is cached (the dry run, dry_run.py).

The units and their cache keys are the builder's own (build/__init__.py ``_Builder``:
the same emitted sources, shard plan, key functions and kernel index), so a unit
listed as cached is one the build links without compiling. Keying asks nvcc for its
version (and its include folder, ``--dryrun``), as every build does; nothing is
compiled, and nothing is written: no cache folder, lock, index record or staging
folder is created.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import build as pkg
from ..errors import ToolchainError
from ..ir import Plan
from .cache import BuildCache
from .shards import choose_shards, header_compatible_groups, job_slots

STRATEGIES = ("sharded", "single", "per-region")


@dataclass
class PlannedUnit:
    """One translation unit a build would have: name (as the build report names it),
    the kernels it holds, cached (True: the cache holds its object, nothing to
    compile; False: nvcc would compile it; None: not checked, no toolchain to key it),
    failed (cached as a failed compile: its kernels' regions would fall back) and
    entry (the cache folder it is, or would be, published to; "" when not keyed)."""

    name: str
    kernels: tuple
    cached: bool | None
    failed: bool = False
    entry: str = ""


@dataclass
class BuildPreview:
    """strategy and jobs (parallel nvcc processes) of the build; kernels: the plan's
    distinct kernels; units: PlannedUnits; library_cached: whether the library
    linked from them is cached too (None: not known); cache: the cache folder;
    toolchain_error: why nothing could be keyed (nvcc or CUTLASS not found: the
    compile would raise ToolchainError), else ""."""

    strategy: str
    jobs: int
    kernels: int
    cache: str
    units: list = field(default_factory=list)
    library_cached: bool | None = None
    toolchain_error: str = ""
    kernel_names: tuple = ()          # the plan's distinct kernels, by name

    @property
    def cached(self) -> list:
        return [u for u in self.units if u.cached]

    @property
    def to_compile(self) -> list:
        return [u for u in self.units if u.cached is False]

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """One line: "N kernels in M units: K cached, U to compile" and the link."""
        if not self.units:
            return "nothing to build: no region offloaded"
        head = f"{_n(self.kernels, 'kernel')} in {_n(len(self.units), 'unit')}"
        if self.toolchain_error:
            return f"{head}: the cache not checked ({self.toolchain_error})"
        link = ("the library is cached too" if self.library_cached
                else "then the library is linked" if self.library_cached is False else "then the link")
        return f"{head}: {len(self.cached)} cached, {len(self.to_compile)} to compile; {link}"

    def format(self) -> str:
        out = [f"build ({self.strategy}, {_n(self.jobs, 'job')}; dry run, nothing compiled): "
               f"{self.summary()}"]
        for u in self.units:
            status = ("not checked" if u.cached is None else "to compile" if not u.cached
                      else "cached as FAILED (its regions fall back)" if u.failed else "cached")
            mine = sum(1 for k in u.kernels if k in self.kernel_names)
            # a unit an earlier build compiled may hold other models' kernels too
            held = (f"{mine} of its {len(u.kernels)} kernels" if self.kernel_names and mine != len(u.kernels)
                    else _n(len(u.kernels), 'kernel'))
            out.append(f"  {u.name:<40} {held:>11}  {status}")
        out.append(f"  cache: {self.cache}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.format()


def _n(count: int, noun: str) -> str:
    return f"{count} {noun if count == 1 else noun + 's'}"


def preview(plan: Plan, strategy: str = "sharded", cache: BuildCache | None = None,
            jobs: int | None = None) -> BuildPreview:
    """The BuildPreview of ``build(plan, strategy, cache, jobs)`` on this machine (its
    cores and memory plan the shards, as for the build). Raises ValueError for an
    unknown strategy. Without nvcc or CUTLASS the units are listed unkeyed
    (``cached`` None) and ``toolchain_error`` says why."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown build strategy {strategy!r}")
    cache = cache or BuildCache()
    kernels = len(plan.distinct_kernels)
    if not plan.regions:
        return BuildPreview(strategy, 0, 0, str(cache.root))
    try:
        b = pkg._Builder(plan, cache, jobs)
    except ToolchainError as e:
        return _unkeyed(plan, strategy, cache, jobs, str(e).splitlines()[0])
    jobs = b.jobs
    if strategy == "per-region":
        units = [_object(b, r.name, "region", pkg.emit_region_unit(plan, i, b.sources))
                 for i, r in enumerate(plan.regions)]
        units.append(_object(b, "library_info", "library_info", pkg.emit_info_unit(plan), cutlass=False))
    elif strategy == "single" and len(header_compatible_groups(plan.distinct_kernels)) == 1:
        unit = _single(b)
        return BuildPreview(strategy, 1, kernels, str(cache.root), [unit], unit.cached and not unit.failed)
    else:       # sharded, or single with kernels whose headers clash: one unit per group
        groups = header_compatible_groups(plan.distinct_kernels) if strategy == "single" else None
        units = _sharded(b, groups)
    return BuildPreview(strategy, jobs, kernels, str(cache.root), units, _library_cached(b, units),
                        kernel_names=tuple(k.name for k in plan.distinct_kernels))


def _object(b, name: str, prefix: str, tu, cutlass: bool = True) -> PlannedUnit:
    """As ``_Builder._object_job`` keys and looks up one object."""
    key = b._unit_key(tu, cutlass)
    hit = b.cache.lookup("obj", prefix, key, pkg.OBJ_NAME)
    entry = hit[0] if hit is not None else b.cache.entry_dir("obj", prefix, key)
    return PlannedUnit(name, tuple(tu.kernels), hit is not None,
                       hit is not None and not hit[1].get("ok", True), str(entry))


def _sharded(b, shards=None) -> list:
    """As ``_Builder.sharded``: units of earlier builds that serve kernels of this
    plan, then shards of the rest (``shards`` given: those, nothing reused), then
    the launchers."""
    reused = b.reused_units() if shards is None else []
    units = [PlannedUnit(prefix, tuple(meta.get("kernels", ())), True, False, str(d))
             for prefix, d, meta in reused]
    units += [_object(b, prefix, prefix, tu)
              for prefix, tu in b.shard_units(shards if shards is not None else b.todo_shards(reused))]
    units.append(_object(b, "launchers", "launchers", pkg.emit_launchers(b.plan), cutlass=False))
    return units


def _single(b) -> PlannedUnit:
    """As ``_Builder.single`` keys its one nvcc to the library."""
    src, prefix, key = b.single_source()
    hit = b.cache.lookup("lib", prefix, key, pkg.LIB_NAME)
    entry = hit[0] if hit is not None else b.cache.entry_dir("lib", prefix, key)
    return PlannedUnit("single", tuple(src.kernels), hit is not None,
                       hit is not None and not hit[1].get("ok", True), str(entry))


def _library_cached(b, units) -> bool | None:
    """As ``_Builder._finish`` keys the link of ``units``' objects; None when a unit is
    cached as failed (the build then prunes the plan, and links another library)."""
    if any(u.failed for u in units):
        return None
    prefix, key = b.link_key(b.plan, sorted({Path(u.entry).name for u in units}))
    return b.cache.lookup("lib", prefix, key, pkg.LIB_NAME) is not None


def _unkeyed(plan: Plan, strategy: str, cache: BuildCache, jobs, why: str) -> BuildPreview:
    """The units without a toolchain to key them: the shard plan of every kernel (no
    earlier unit can be found without keys), the header groups, or the regions."""
    jobs = jobs or job_slots(plan.kernels)
    distinct = list(plan.distinct_kernels)
    if strategy == "per-region":
        units = [PlannedUnit(r.name, (k.name,), None) for r, k in plan.pairs]
        units.append(PlannedUnit("library_info", (), None))
    else:
        groups = header_compatible_groups(distinct)
        if strategy == "single" and len(groups) == 1:
            return BuildPreview(strategy, 1, len(distinct), str(cache.root),
                                [PlannedUnit("single", tuple(k.name for k in distinct), None)], None, why)
        shards = groups if strategy == "single" else choose_shards(distinct, jobs)
        units = [PlannedUnit(pkg.shard_name(s), tuple(k.name for k in s), None) for s in shards]
        units.append(PlannedUnit("launchers", (), None))
    return BuildPreview(strategy, jobs, len(distinct), str(cache.root), units, None, why)
