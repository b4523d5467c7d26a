"""What a build produced and what each translation unit cost (plain data)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..ir import Plan


@dataclass
class UnitReport:
    """One translation unit of a build: what it holds and what it cost."""

    name: str
    kernels: tuple
    seconds: float
    cache_hit: bool
    ok: bool
    peak_rss_mb: float = 0.0
    source: str = ""
    log: str = ""
    executor: str = ""       # who compiled it: "local", "ray (host)", "local (ray: why)"; "" if cached


@dataclass
class BuildResult:
    """library: the .so (inside the cache); plan: the plan it serves (regions whose
    kernel failed to compile removed and listed in plan.fallbacks); seconds: wall
    time of the whole build; units: every translation unit; failures: (kernel, log)."""

    library: Path
    plan: Plan
    strategy: str
    seconds: float
    jobs: int
    units: list = field(default_factory=list)
    link_seconds: float = 0.0
    failures: list = field(default_factory=list)

    @property
    def cache_hit(self) -> bool:
        return all(u.cache_hit for u in self.units) and not self.link_seconds

    @property
    def compiled(self) -> list:
        return [u for u in self.units if not u.cache_hit]

    @property
    def critical_path(self) -> float:
        """The longest unit compiled plus the link: the floor of this build's wall time."""
        return max((u.seconds for u in self.compiled), default=0.0) + self.link_seconds

    @property
    def sources(self) -> list:
        return [u.source for u in self.units if u.source]

    def to_dict(self) -> dict:
        return {"library": str(self.library), "strategy": self.strategy, "seconds": self.seconds,
                "jobs": self.jobs, "cache_hit": self.cache_hit, "link_seconds": self.link_seconds,
                "critical_path_seconds": self.critical_path,
                "units": [asdict(u) for u in self.units],
                "failures": [{"kernel": k, "log": str(l)} for k, l in self.failures]}

    def format(self) -> str:
        rows = [f"build ({self.strategy}, {self.jobs} jobs): {self.seconds:.1f} s wall, "
                f"critical path {self.critical_path:.1f} s, link {self.link_seconds:.1f} s"]
        rows.append(f"  {'unit':<40} {'kernels':>7} {'seconds':>8} {'peak MB':>8}  status  executor")
        for u in sorted(self.units, key=lambda u: -u.seconds):
            status = "cached" if u.cache_hit else ("ok" if u.ok else "FAILED")
            rows.append(f"  {u.name[:40]:<40} {len(u.kernels):>7} {u.seconds:>8.1f} "
                        f"{u.peak_rss_mb:>8.0f}  {status:<6}  {u.executor or '-'}")
        for k, log in self.failures:
            rows.append(f"  kernel failed: {k} (log: {log})")
        return "\n".join(rows)
