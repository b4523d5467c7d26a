"""Run compile jobs in parallel (threads waiting on nvcc processes), with a
progress bar and per-job wall time and peak memory."""
from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from ..config import knobs


@dataclass
class Job:
    """One nvcc invocation. kernels: the kernel names it compiles (for progress);
    estimate: predicted seconds, used to start the longest jobs first."""

    name: str
    cmd: list
    kernels: tuple = ()
    estimate: float = 1.0
    log_path: Path | None = None


@dataclass
class JobResult:
    name: str
    ok: bool
    seconds: float
    peak_rss: int            # bytes, the largest process of the job (nvcc, cicc, ptxas...)
    log: str
    kernels: tuple = field(default_factory=tuple)
    killed: bool = False     # by a signal: transient (not cached as a failure)
    executor: str = "local"  # where it ran: "local", "ray (host)", "local (ray: why not)"


def run_job(job: Job) -> JobResult:
    """Run one job now, in this thread."""
    if knobs().verbose:
        print(" ".join(job.cmd), flush=True)
    t0 = time.perf_counter()
    with open(job.log_path or os.devnull, "w+") as log:
        proc = subprocess.Popen(job.cmd, stdout=log, stderr=subprocess.STDOUT)
        # wait4 returns the child's rusage, which covers the compiler processes
        # nvcc itself waited for: ru_maxrss is their largest resident set (KiB)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        text = log.read() if job.log_path else ""
    killed = was_killed(proc.returncode, text)
    if killed:
        # SIGKILL is what the kernel's OOM killer sends: say so instead of a bare status
        text += (f"\n[cutlass_offload] {job.cmd[0]} was killed (status {proc.returncode}); "
                 "interrupted, or out of memory? Lower the parallel jobs with "
                 "CUTLASS_OFFLOAD_JOBS.\n")
    return JobResult(job.name, proc.returncode == 0, time.perf_counter() - t0,
                     usage.ru_maxrss * 1024, text, job.kernels, killed=killed)


def was_killed(returncode: int, log: str) -> bool:
    """True when the compiler died by a signal (Ctrl-C, timeout, OOM killer): a
    transient failure, never cached. nvcc itself exits 2 when one of its tools
    (cicc, cudafe++, ptxas) dies by a signal and logs "died due to signal"; a
    shell-style wrapper exits 128 + signal."""
    return (returncode < 0 or returncode in (130, 137, 143)
            or (returncode != 0 and "died due to signal" in log))


def run_jobs(jobs: list, workers: int, desc: str = "compiling", runner=None) -> list:
    """Run jobs, longest estimate first, at most ``workers`` at once.

    Returns JobResults in the order of ``jobs``. The bar counts kernels done out of
    kernels total, with elapsed time and ETA (tqdm; hidden when stderr is no TTY).
    """
    if not jobs:
        return []
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i].estimate)
    total = sum(max(1, len(j.kernels)) for j in jobs)
    results = [None] * len(jobs)
    bar = _bar(total, desc)
    try:
        with ThreadPoolExecutor(max(1, workers)) as pool:
            futures = {pool.submit(runner or run_job, jobs[i]): i for i in order}
            for f in as_completed(futures):
                i = futures[f]
                results[i] = f.result()
                if bar is not None:
                    bar.update(max(1, len(jobs[i].kernels)))
                    bar.set_postfix_str(f"{jobs[i].name} {results[i].seconds:.0f}s")
    finally:
        if bar is not None:
            bar.close()
    return results


def _bar(total, desc):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="kernel", disable=None, dynamic_ncols=True)
