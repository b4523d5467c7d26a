"""Plain data of a tuning run: what was profiled, how each candidate did, who won.

A candidate's ``status`` is one of ``STATUSES``; only "ok" candidates have a time
and can win. Times are microseconds per launch (median over replays of a CUDA
graph of back-to-back launches; tune/profile.py).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..ir import KernelConfig, config_from_dict, config_to_dict  # noqa: F401 - re-exported

STATUSES = (
    "ok",                  # ran, matched the float32 reference, timed
    "compile failed",      # nvcc failed on the kernel (its log is in detail)
    "cannot implement",    # the kernel's can_implement / alignment checks refused the problem
    "error",               # the launcher returned another failure status, or CUDA reported an error
    "wrong result",        # ran but disagreed with the float32 reference
    "crashed",             # the profiling process died or hung on this candidate
    "not profiled",        # the profiler itself could not run (no result is cached)
)


def choice_to_dict(config: dict, launch: dict | None) -> dict:
    """A winner as saved (manifest "tuned", TuningReport.to_dict): the config's
    fields plus "launch" (GemmLaunch fields) when it is not the default."""
    return dict(config, launch=launch) if launch else dict(config)


def choice_from_dict(config: dict, launch: dict | None = None) -> tuple:
    """(KernelConfig, GemmLaunch) from ``choice_to_dict``'s dict (or a config dict
    and a separate launch dict). Raises ValueError / TypeError for data of another
    shape."""
    from ..ir import GemmLaunch
    config = dict(config)
    launch = config.pop("launch", None) or launch or {}
    return config_from_dict(config), GemmLaunch(**launch)


@dataclass
class CandidateResult:
    """One candidate kernel on one problem: kernel name, its config tag, status
    (see STATUSES), median microseconds per launch when ok, relative error against
    the float32 reference when it ran, and what went wrong otherwise."""

    kernel: str
    tag: str
    status: str
    us: float | None = None
    rel_err: float | None = None
    detail: str = ""
    launch: dict | None = None          # GemmLaunch fields it ran with (None: the defaults)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


@dataclass
class TunedProblem:
    """One distinct GEMM problem of the plan.

    key: the tuning cache key. tuning_id: select.tuning_id(problem) (canonical JSON
    of m, n, k, batch, dtypes, layouts, alignments, epilogue). regions: how many regions of the plan share it. cached: the result came from
    the tuning cache (nothing profiled). heuristic / winner: config tags; winner
    is None when no candidate ran correctly (the heuristic's kernel is kept).
    torch_us: the PyTorch ops the region replaces, timed the same way.
    """

    key: str
    tuning_id: str
    regions: int
    cached: bool
    heuristic: str
    winner: str | None
    winner_config: dict | None
    candidates: list = field(default_factory=list)     # CandidateResult
    torch_us: float | None = None
    winner_launch: dict | None = None                  # GemmLaunch fields of the winner

    @property
    def problem(self) -> dict:
        return json.loads(self.tuning_id)

    @property
    def label(self) -> str:
        p = self.problem
        batch = f"x{p['batch']}" if p.get("batch", 1) != 1 else ""
        return f"{p['m']}x{p['n']}x{p['k']}{batch} {p['dtype']} {_epilogue_tag(p['epilogue'])}"


def _epilogue_tag(ep: dict) -> str:
    from ..ir import GemmEpilogue
    return GemmEpilogue(**ep).tag


@dataclass
class TuningReport:
    """Every distinct GEMM problem of one ``--tune`` compile (tuned or cached) and
    the build of the candidates (a BuildResult.to_dict(), empty when all hit)."""

    gpu: str
    problems: list = field(default_factory=list)       # TunedProblem
    build: dict = field(default_factory=dict)
    seconds: float = 0.0
    ranking: dict = field(default_factory=dict)        # proxy tuning id -> [CandidateResult dict]

    @property
    def winners(self) -> dict:
        """{tuning_id: (KernelConfig, GemmLaunch)} for select (problems with a winner only)."""
        return {p.tuning_id: choice_from_dict(p.winner_config, p.winner_launch)
                for p in self.problems if p.winner_config is not None}

    @property
    def profiled(self) -> int:
        """How many problems were profiled in this run (not cache hits)."""
        return sum(1 for p in self.problems if not p.cached)

    def to_dict(self) -> dict:
        """JSON-able: gpu, seconds, build, problems (with labels) and winners
        ({tuning_id: KernelConfig as a dict}, what a saved folder reloads with)."""
        return {"gpu": self.gpu, "seconds": self.seconds, "build": self.build,
                "problems": [dict(asdict(p), label=p.label) for p in self.problems],
                "winners": {p.tuning_id: choice_to_dict(p.winner_config, p.winner_launch)
                            for p in self.problems if p.winner_config is not None},
                "ranking": self.ranking}

    def format(self) -> str:
        return format_tuning(self.to_dict())


def format_tuning(d: dict) -> str:
    """The candidate table of a TuningReport.to_dict() (the compile report prints it)."""
    problems = d.get("problems", [])
    profiled = sum(1 for p in problems if not p["cached"])
    rows = [(f"tuning on {d.get('gpu')}: {len(problems)} GEMM problems, {profiled} profiled, "
             f"{len(problems) - profiled} from the tuning cache ({d.get('seconds', 0.0):.1f} s)")]
    for p in problems:
        src = "cached" if p["cached"] else "profiled"
        torch_us = f", PyTorch {p['torch_us']:.2f} us" if p.get("torch_us") else ""
        n = p["regions"]
        rows.append(f"  {p['label']} ({n} region{'s' if n != 1 else ''}, {src}{torch_us})")
        times = {c["tag"]: c["us"] for c in p["candidates"] if c["status"] == "ok"}
        for c in p["candidates"]:
            mark = "*" if c["tag"] == p["winner"] else " "
            h = " (heuristic)" if c["tag"] == p["heuristic"] else ""
            t = f"{c['us']:9.2f} us" if c.get("us") is not None else f"{'-':>12}"
            detail = (c.get("detail") or "").strip()
            why = f"  {detail.splitlines()[0][:80]}" if c["status"] != "ok" and detail else ""
            rows.append(f"   {mark} {c['tag']:<36} {t}  {c['status']}{h}{why}")
        h_us, w_us = times.get(p["heuristic"]), times.get(p["winner"])
        if p["winner"] is None or not w_us:
            rows.append("    no candidate ran correctly: the heuristic's kernel is kept")
            continue
        parts = [f"{h_us / w_us:.2f}x the heuristic's speed" if h_us else "the heuristic's kernel did not run"]
        if p.get("torch_us"):
            parts.append(f"{p['torch_us'] / w_us:.2f}x PyTorch's speed")
        rows.append(f"    winner {p['winner']}: " + ", ".join(parts))
    return "\n".join(rows)
