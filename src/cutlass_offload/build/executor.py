"""Where one translation unit is compiled: this machine (``LocalExecutor``, the
default) or a Ray cluster (``RayExecutor``, the optional ``ray`` extra).

The builder (build/__init__.py) keeps the cache logic: it locks the key, writes the
unit's source into a staging folder, asks an executor for ``staging/unit.o`` and
``staging/nvcc.log``, and publishes the folder exactly as before. An executor only
runs "nvcc on this source with these flags" and reports seconds and peak memory.

A ``CompileTask`` carries everything a remote worker needs and nothing of this
machine: the source text, the nvcc command with placeholder paths, and the
toolchain identity of the cache key (nvcc version, CUTLASS version, arch). A Ray
worker checks that identity before compiling (a mismatch raises
``ToolchainMismatch``: its object would be published under a key it does not
match) and compiles in a private temporary folder; the object bytes or the
failure log come back through Ray. A mismatch, a crashed or cancelled task, an
nvcc killed on the worker or a worker without this package: the unit is built on
this machine instead, and its ``UnitReport.executor`` says why.
"""
from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from ..config import knobs
from ..errors import CutlassOffloadError, ToolchainError
from . import nvcc_steps, toolchain
from .jobs import Job, JobResult, run_job, was_killed
from .scratch import scratch_dir
from .shards import job_slots

EXECUTORS = ("local", "ray")
RAY_EXTRA_HINT = "pip install 'cutlass_offload[ray]'"

# placeholders of a portable command: each worker puts its own paths in
NVCC, SOURCE, OBJECT, CUTLASS, PACKAGE = "{nvcc}", "{source}", "{object}", "{cutlass}", "{package}"
_PLACEHOLDERS = (NVCC, SOURCE, OBJECT, CUTLASS, PACKAGE)
_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)


class ToolchainMismatch(CutlassOffloadError):
    """A worker's nvcc or CUTLASS differs from the build's cache key."""


@dataclass(frozen=True)
class ToolchainId:
    """What of the toolchain enters every object's cache key (build/cache.py)."""

    nvcc_version: str       # the 'Build cuda_...' line of nvcc --version
    cutlass_version: str    # toolchain.cutlass_version(): version + header-tree hash
    arch: str               # "sm80" / "sm90a"

    @classmethod
    def here(cls, nvcc: str, arch: str, fresh: bool = False) -> ToolchainId:
        """This process's toolchain. fresh: ask nvcc again (a long-lived worker may
        have had its toolkit replaced since the last task)."""
        version = toolchain.nvcc_version
        if fresh:       # past its lru_cache
            version = getattr(version, "__wrapped__", version)
        return cls(version(nvcc), toolchain.cutlass_version(), arch)


@dataclass(frozen=True)
class CompileTask:
    """One nvcc -c of one translation unit, independent of this machine's paths.

    command: the nvcc command with NVCC / SOURCE / OBJECT / CUTLASS / PACKAGE
      placeholders; peak_memory: bytes one such nvcc needs (shards.peak_memory).
    """

    name: str
    source: str
    command: tuple
    identity: ToolchainId
    peak_memory: float
    kernels: tuple = ()
    estimate: float = 1.0

    @classmethod
    def make(cls, name, source, arch, cutlass, identity, peak_memory, kernels=(), estimate=1.0,
             threads=1, flags=()):
        cmd = toolchain.compile_command(NVCC, arch, SOURCE, OBJECT, cutlass, threads, flags)
        root = str(toolchain.cutlass_root()) if cutlass else None
        return cls(name, source, tuple(portable(cmd, root)), identity, peak_memory, tuple(kernels),
                   estimate)

    def localized(self, nvcc: str, source: str, obj: str) -> list:
        """The command with this machine's paths (ToolchainError for a placeholder
        this machine cannot fill)."""
        names = {NVCC: nvcc, SOURCE: source, OBJECT: obj, PACKAGE: _PACKAGE_DIR}
        if any(CUTLASS in a for a in self.command):
            names[CUTLASS] = str(toolchain.cutlass_root())
        out = []
        for a in self.command:
            for k, v in names.items():
                a = a.replace(k, v)
            if any(p in a for p in _PLACEHOLDERS):
                raise ToolchainError(f"unresolved placeholder in compile argument {a!r}")
            out.append(a)
        return out


def portable(cmd: list, cutlass_root: str | None) -> list:
    """Replace this machine's CUTLASS and package folders in ``cmd`` by placeholders."""
    out = []
    for a in cmd:
        if cutlass_root:
            a = a.replace(cutlass_root, CUTLASS)
        out.append(a.replace(_PACKAGE_DIR, PACKAGE))
    return out


class LocalExecutor:
    """nvcc on this machine (today's behaviour): the object is written in place."""

    name = "local"

    def __init__(self, nvcc: str | None = None):
        self.nvcc = nvcc

    def slots(self, kernels=()) -> int:
        """Parallel compiles worth running: cores, capped by memory (shards.job_slots)."""
        return job_slots(kernels)

    def compile(self, task: CompileTask, staging: Path) -> tuple:
        """(JobResult, command run) for ``staging/unit.cu`` -> ``staging/unit.o``,
        log in ``staging/nvcc.log``."""
        nvcc = self.nvcc or toolchain.find_nvcc()
        cmd = task.localized(nvcc, str(staging / "unit.cu"), str(staging / "unit.o"))
        if knobs().nvcc_steps:
            # nvcc's own steps, host and device sides side by side (build/nvcc_steps.py)
            steps = nvcc_steps.run(cmd, staging / "unit.cu", staging / "nvcc.log")
            if steps is not None:
                code = next((c for c in steps.returncodes if c), 0)
                return JobResult(task.name, steps.ok, steps.seconds, steps.peak_rss, steps.log,
                                 task.kernels, killed=was_killed(code, steps.log),
                                 executor=f"{self.name} (nvcc steps)"), cmd
        res = run_job(Job(task.name, cmd, task.kernels, task.estimate, staging / "nvcc.log"))
        res.executor = self.name
        return res, cmd


def compile_on_worker(task: CompileTask) -> dict:
    """Ray task body, run on a worker: check the toolchain, compile in a private
    folder, return {ok, seconds, peak_rss (bytes), log, object (bytes or None),
    killed, host}. Raises ToolchainMismatch before compiling when this worker's
    nvcc or CUTLASS is not the task's; ToolchainError without nvcc or CUTLASS."""
    nvcc = toolchain.find_nvcc()
    have = ToolchainId.here(nvcc, task.identity.arch, fresh=True)
    if have != task.identity:
        theirs, ours = have, task.identity
        raise ToolchainMismatch(
            f"worker {socket.gethostname()} has nvcc {theirs.nvcc_version!r} and CUTLASS "
            f"{theirs.cutlass_version!r}; the build needs nvcc {ours.nvcc_version!r} and "
            f"CUTLASS {ours.cutlass_version!r}")
    with scratch_dir("cutlass_offload-") as d:
        src, obj = Path(d) / "unit.cu", Path(d) / "unit.o"
        src.write_text(task.source)
        res = run_job(Job(task.name, task.localized(nvcc, str(src), str(obj)), task.kernels,
                          task.estimate, Path(d) / "nvcc.log"))
        data = obj.read_bytes() if res.ok else None
    return {"ok": res.ok, "seconds": res.seconds, "peak_rss": res.peak_rss, "log": res.log,
            "object": data, "killed": res.killed, "host": socket.gethostname()}


class RayExecutor:
    """Each compile is a Ray task (num_cpus=1, memory= the nvcc's peak) on a cluster
    whose workers have this package, the same nvcc and the same nvidia-cutlass.

    address: passed to ``ray.init`` ("127.0.0.1:6379", "auto", "ray://host:10001"
      with ray[client]); None = RAY_ADDRESS, else a running local cluster, else a new
      local one. Connects on first use, unless Ray is already initialized in this
      process (then that connection is used). max_retries: Ray's retries of a task
      whose worker died, before building the unit here. task_timeout: seconds to wait
      for one task (default 1800: a 3.x sm_90a unit takes 1-3 minutes on 2 cores) before
      cancelling it and building the unit here, so a hung worker cannot hang the build.
    Raises ToolchainError naming the ``ray`` extra when Ray is not installed.
    """

    name = "ray"

    def __init__(self, address: str | None = None, max_retries: int = 1, local: LocalExecutor | None = None,
                 task_timeout: float = 1800.0):
        self.ray = import_ray()
        self.address, self.max_retries, self.task_timeout = address, max_retries, task_timeout
        self.local = local or LocalExecutor()
        self._lock = threading.Lock()
        self._remote = None
        # units that fall back share this machine's cores like a local build
        self._local_slots = threading.BoundedSemaphore(max(1, job_slots()))

    def _connect(self):
        with self._lock:
            if self._remote is None:
                ray = self.ray
                if not ray.is_initialized():
                    try:
                        ray.init(address=self.address, logging_level="WARNING", log_to_driver=False)
                    except Exception as e:   # ConnectionError, ValueError, RuntimeError by version
                        raise CutlassOffloadError(
                            f"cannot connect to the Ray cluster at {self.address or 'RAY_ADDRESS/auto'}: "
                            f"{e}") from e
                self._remote = ray.remote(compile_on_worker)
        return self._remote

    def slots(self, kernels=()) -> int:
        """Parallel compiles: the cluster's CPUs (at least this machine's slots)."""
        self._connect()
        cpus = int(self.ray.cluster_resources().get("CPU", 0))
        return max(cpus, 1)

    def compile(self, task: CompileTask, staging: Path) -> tuple:
        """(JobResult, command) like LocalExecutor.compile; on any Ray failure or a
        toolchain mismatch the unit is compiled here, executor 'local (ray: why)'."""
        remote = self._connect()
        ray = self.ray
        room = max((n["Resources"].get("memory", 0) for n in ray.nodes()
                    if n.get("Alive") and n["Resources"].get("CPU", 0) >= 1), default=0)
        if room < task.peak_memory:     # Ray would wait forever for an infeasible task
            return self._fallback(task, staging, f"no node with a CPU and {task.peak_memory / 2**30:.1f} "
                                                 "GiB of memory for one nvcc")
        try:
            ref = remote.options(num_cpus=1, memory=int(task.peak_memory), max_retries=self.max_retries,
                                 retry_exceptions=False, name=f"nvcc {task.name}").remote(task)
            out = ray.get(ref, timeout=self.task_timeout)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)         # frees the worker's CPU and memory
            return self._fallback(task, staging, f"no result within {self.task_timeout:g} s")
        except ray.exceptions.RayError as e:
            return self._fallback(task, staging, ray_failure(e))
        if out["killed"]:               # e.g. the worker's OOM killer: transient, not a result
            return self._fallback(task, staging, f"nvcc killed on {out['host']}")
        if out["ok"]:
            (staging / "unit.o").write_bytes(out["object"])
        (staging / "nvcc.log").write_text(out["log"])
        cmd = task.localized("nvcc", str(staging / "unit.cu"), str(staging / "unit.o"))
        res = JobResult(task.name, out["ok"], out["seconds"], out["peak_rss"], out["log"], task.kernels,
                        executor=f"ray ({out['host']})")
        return res, cmd

    def _fallback(self, task, staging, why: str) -> tuple:
        with self._local_slots:
            res, cmd = self.local.compile(task, staging)
        res.executor = f"local (ray: {why})"
        return res, cmd


def ray_failure(e: BaseException) -> str:
    """One line saying why a Ray task gave no object (the task's own error when it
    raised one, e.g. ToolchainMismatch; else the Ray error's kind and first line)."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        e = cause
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def import_ray():
    """The ``ray`` module, or ToolchainError naming the extra to install."""
    try:
        import ray
    except ImportError as e:
        raise ToolchainError(f"the Ray executor needs Ray: {RAY_EXTRA_HINT} ({e})") from e
    return ray


def make_executor(name: str = "local", ray_address: str | None = None):
    """The executor called ``name`` ("local" or "ray"). Raises ValueError for another
    name, ToolchainError for "ray" without Ray installed."""
    if name == "local":
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(ray_address)
    raise ValueError(f"unknown executor {name!r}; use one of {', '.join(EXECUTORS)}")
