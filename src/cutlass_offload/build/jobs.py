"""Run compile jobs in parallel (threads waiting on nvcc processes), with progress
(a bar on a terminal, lines otherwise) and per-job wall time and peak memory."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
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


# Set when SIGINT reaches a run_jobs call (Ctrl-C): a terminal's Ctrl-C also reaches
# nvcc's tools, and cicc and cudafe++ then exit 4 ("Compilation terminated"), which
# reads as a compile error (a fresh-user trial found such a unit cached as failed)
_INTERRUPTED = threading.Event()


def _flagging(previous):
    """A SIGINT handler that sets _INTERRUPTED, then does what ``previous`` does."""
    def handler(signum, frame):
        _INTERRUPTED.set()
        return previous(signum, frame)
    return handler


def mark_interrupted(result: JobResult, wait: float = 0.5) -> bool:
    """Mark ``result`` killed (transient, never cached as a failure; a line in its log
    says why) if it is a failure of a compile the build's interrupt ended: the result
    failed and a run_jobs call is being interrupted, or is within ``wait`` seconds (the
    interrupt reaches the main thread's handler after the children see it). Returns
    whether the result is killed now. Mutates ``result``: hence ``mark_``."""
    if result.ok or result.killed or not _INTERRUPTED.wait(wait):
        return result.killed
    result.killed = True
    result.log += "\n[cutlass_offload] the build was interrupted while this unit compiled: not a result\n"
    return True


# A compiler's own diagnostic on the unit (its source, or CUTLASS's headers instantiated
# from it): the same source and toolchain fail the same way again, so the failure may be
# cached. EDG's front end (cudafe++, cicc): "file(line): error"; the host compiler:
# "file:line:col: error:"; ptxas on the unit's PTX.
_DIAGNOSTIC = re.compile(r"\(\d+\): (catastrophic )?error"
                         r"|:\d+(:\d+)?: (fatal )?error:"
                         r"|^ptxas (error|fatal)\s*:", re.M)


def mark_toolchain_failure(result: JobResult) -> bool:
    """Mark and return whether ``result`` failed without a compiler diagnostic on the
    unit: the toolchain broke (a host compiler that cannot run, an nvcc wrapper that
    exits 1, cicc killed for memory), not the source, so it must not be cached as the
    unit's failure (a fresh-user trial, session 50: a broken gcc on PATH left every
    kernel "failed to compile" after gcc was fixed). Mutates ``result``: a line saying
    so goes to its log."""
    if result.ok or result.killed or _DIAGNOSTIC.search(result.log or ""):
        return False
    result.log += ("\n[cutlass_offload] no compiler diagnostic on the unit in this log: the "
                   "toolchain failed, not the source; not cached, the next build tries again\n")
    return True


def run_jobs(jobs: list, workers: int, desc: str = "compiling", runner=None,
             heavy=None, heavy_limit: int | None = None, speed_file: Path | None = None) -> list:
    """Run jobs, longest estimate first, at most ``workers`` at once, and of those
    for which ``heavy(job)`` holds at most ``heavy_limit`` (None: ``workers``).

    The light ones (the launchers: seconds, no CUTLASS) start first: a build gives
    them a slot of their own beside the CUTLASS units, and that slot must not pass
    to another CUTLASS unit once they are done (on a 2-core 24 GiB machine three
    7-kernel sm90a units at once took all its memory and stalled a prebuild for
    over half an hour, session 31). Returns JobResults in the order of ``jobs``.
    Progress (``Progress``) counts kernels: a job weighs as many kernels as it
    compiles (the launchers, none). An exception of ``runner``, or a
    KeyboardInterrupt, is raised after the jobs already running end; queued jobs
    are not started. speed_file: where this machine's measured build speed is kept
    for the next ETA (``Progress``; None: not kept).
    """
    if not jobs:
        return []
    _INTERRUPTED.clear()
    # the flag is set by the signal handler, wherever in this call the main thread is
    # when KeyboardInterrupt comes (one came inside pool.submit); only Python's own
    # kind of handler is wrapped (SIG_IGN / SIG_DFL behave as before)
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if callable(previous):
        signal.signal(signal.SIGINT, _flagging(previous))
    heavy = heavy or (lambda job: True)
    order = sorted(range(len(jobs)), key=lambda i: (heavy(jobs[i]), -jobs[i].estimate))
    results = [None] * len(jobs)
    heavy_slots = max(1, min(workers, heavy_limit or workers))
    progress = Progress(jobs, heavy_slots, desc, speed_file=speed_file)
    run = runner or run_job
    limit = threading.BoundedSemaphore(heavy_slots)

    def started(i):
        if not heavy(jobs[i]):
            progress.started(i)
            return run(jobs[i])
        with limit:
            progress.started(i)
            return run(jobs[i])
    try:
        with ThreadPoolExecutor(max(1, workers)) as pool:
            futures = {pool.submit(started, i): i for i in order}
            waiting = set(futures)
            try:
                while waiting:
                    done, waiting = wait(waiting, timeout=progress.tick_seconds,
                                         return_when=FIRST_COMPLETED)
                    for f in done:
                        i = futures[f]
                        results[i] = f.result()
                        progress.finished(i, results[i])
                    if not done:
                        progress.tick()
            except BaseException:
                # Ctrl-C (or a runner's error): start no queued job; the pool's exit
                # waits only for the running ones (a terminal's Ctrl-C ends their nvcc)
                for f in waiting:
                    f.cancel()
                raise
    finally:
        progress.close()
        if callable(previous):
            signal.signal(signal.SIGINT, previous)
    return results


def progress_mode() -> str:
    """"bar" (a terminal), "lines" (a pipe, a file, a notebook) or "off", from
    CUTLASS_OFFLOAD_PROGRESS (auto / bar / lines / off; the CLI's -q sets off)."""
    mode = knobs().progress
    if mode == "auto":
        try:
            return "bar" if sys.stderr.isatty() else "lines"
        except (AttributeError, ValueError):         # replaced or closed stderr
            return "lines"
    return mode


def _plus_units(names) -> str:
    """The kernel-less units (the launchers) after the count, so that it adds up with the
    report's "N of M units compiled", which counts them."""
    if not names:
        return ""
    return f", plus the {names[0]} unit" if len(names) == 1 else f", plus units {', '.join(names)}"


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


class Progress:
    """What one ``run_jobs`` call shows on stderr while it runs.

    On a terminal a tqdm bar of kernels done out of kernels total; otherwise one
    line when it starts, one per finished unit and one a minute while none
    finishes. Both name the unit running longest and an ETA: the jobs' estimates
    (build/shards.py's cost model, seconds on a 16-core host; ``FEW_CORES_FACTOR``
    times that on fewer than 8 cores, over ``shards.concurrency_efficiency`` where units
    compile side by side, until a unit has finished here, then scaled by
    the measured seconds per estimated second) placed on the worker slots longest
    first. Silent when no job compiles a kernel (the launchers alone take seconds).
    With a ``speed_file`` (the build cache's), the seconds per estimated second that
    earlier builds on this machine (host name and core count) measured, per unit
    compiled alone, stand in for ``FEW_CORES_FACTOR`` / 1.0, and ``close`` stores this
    build's: the rows are an idle 2-core machine's, and on a slower or busier one the
    first ETA was 2-2.7x short (session 52's fresh-user trial).
    """

    HEARTBEAT = 60.0
    # Seconds per estimated second on fewer than 8 cores before any unit finished
    # here. Since sessions 41-42 build/shards.py's rows are the 2-core seconds of a
    # unit compiled alone by a plain nvcc -c; the build runs nvcc's steps as a graph
    # and overlaps the host passes, so a unit takes less: on the 2-core machine mlp at
    # sm_90a 33-35 s against its estimate of 37 (0.9), mlp and bert-base at sm_80
    # 6.1 and 7.5 s against 9.4 and 10.7 (0.65-0.7;
    # benchmarks/results/unit_costs_sm80_2core_2026-12-06_s42.txt). It was 1.2 with
    # the older rows, which put those sm_80 ETAs at about 3x the build.
    FEW_CORES_FACTOR = 0.8
    # The least a unit running past its estimate is given still to run, as a share of
    # the seconds it has run: a guess, not a measurement, so the ETA stops shrinking
    # towards nothing while the unit goes on.
    OVERDUE_SHARE = 0.25

    def __init__(self, jobs: list, workers: int, desc: str, mode: str | None = None, stream=None,
                 speed_file: Path | None = None):
        self.jobs, self.workers, self.desc = jobs, max(1, workers), desc
        self.speed_file = speed_file
        self.total = sum(len(j.kernels) for j in jobs)
        self.mode = "off" if self.total == 0 else (mode or progress_mode())
        self.stream = stream or sys.stderr
        self.done_kernels = 0
        self.t0 = time.perf_counter()
        self._last_line = self.t0
        self._running = {}            # job index -> start time
        self._finished = set()
        self._measured = [0.0, 0.0]   # seconds, estimate of units compiled here
        self._lock = threading.Lock()
        self.factor = read_speed(speed_file) or (1.0 if (os.cpu_count() or 1) >= 8
                                                 else self.FEW_CORES_FACTOR)
        # the rows are a unit compiled alone; units side by side on few cores each take
        # longer (shards.concurrency_efficiency: 0.675 on 2 slots). Without it the first
        # ETA of the nine issue-16 models' prebuild on 2 cores said 4 min 12 s for 9 min
        # 26 s (session 50, prebuild_nine_2core_2026-12-07_s50.txt).
        at_once = min(self.workers, sum(1 for j in jobs if j.kernels))
        self.efficiency = 1.0
        if at_once > 1:
            from .shards import concurrency_efficiency
            self.efficiency = concurrency_efficiency(at_once)
            self.factor /= self.efficiency
        self.tick_seconds = 1.0 if self.mode == "bar" else 5.0
        self.bar = None
        if self.mode == "bar":
            try:
                from tqdm import tqdm
            except ImportError:
                self.mode = "lines"
            else:
                self.bar = tqdm(total=self.total, desc=desc, unit="kernel", file=self.stream,
                                dynamic_ncols=True,
                                bar_format="{desc}: {n_fmt}/{total_fmt} kernels |{bar}| {elapsed}{postfix}")
        if self.mode == "lines":
            units = sum(1 for j in jobs if j.kernels)
            extra = [j.name for j in jobs if not j.kernels]
            self._line(f"{self.total} kernel{'s' if self.total != 1 else ''} in {units} "
                       f"unit{'s' if units != 1 else ''}" + _plus_units(extra)
                       + (f", {min(self.workers, units)} at a time" if units > 1 else "")
                       + f"; ETA ~{_duration(self.eta())}")

    def started(self, i: int) -> None:
        with self._lock:
            self._running[i] = time.perf_counter()

    def finished(self, i: int, result) -> None:
        with self._lock:
            self._running.pop(i, None)
            self._finished.add(i)
            # the launchers (no kernels, seconds) say nothing of how long kernels take
            if (result is not None and result.ok and result.seconds > 0 and self.jobs[i].kernels
                    and self.jobs[i].estimate > 0):
                self._measured[0] += result.seconds
                self._measured[1] += self.jobs[i].estimate
                self.factor = self._measured[0] / self._measured[1]
        self.done_kernels += len(self.jobs[i].kernels)
        name = self.jobs[i].name
        if result is None:
            what = f"{name} ended"
        elif result.ok and result.seconds == 0:
            what = f"{name} found in the cache (built by another process)"
        elif result.ok:
            what = f"{name} compiled in {_duration(result.seconds)}"
        else:
            what = f"{name} {'killed' if result.killed else 'FAILED'} after {_duration(result.seconds)}"
        if self.bar is not None:
            self.bar.update(len(self.jobs[i].kernels))
            self._postfix()
        elif self.mode == "lines":
            left = self.running_text()
            tail = (f"; {left}; ETA ~{_duration(self.eta())}" if left
                    else f"; done in {_duration(time.perf_counter() - self.t0)}"
                    if len(self._finished) == len(self.jobs) else "")
            self._line(f"[{self.done_kernels}/{self.total} kernels] {what}{tail}")

    def tick(self) -> None:
        if self.bar is not None:
            self._postfix()
        elif self.mode == "lines" and time.perf_counter() - self._last_line >= self.HEARTBEAT:
            self._line(f"[{self.done_kernels}/{self.total} kernels] still {self.running_text()}; "
                       f"ETA ~{_duration(self.eta())}")

    def running_text(self) -> str:
        """"running NAME (63 s)" for the unit running longest ("and N more")."""
        now = time.perf_counter()
        with self._lock:
            running = sorted(self._running.items(), key=lambda kv: kv[1])
        if not running:
            return ""
        i, t = running[0]
        more = f" and {len(running) - 1} more" if len(running) > 1 else ""
        return f"running {self.jobs[i].name} ({_duration(now - t)}){more}"

    def eta(self) -> float:
        """Seconds until every job has ended, predicted (see the class doc). A unit still
        running past its scaled estimate says this machine is slower than the factor:
        the factor becomes at least its seconds per estimated second (for every job
        left), and it is given at least OVERDUE_SHARE of what it has run so far (a loaded
        2-core machine: 'ETA ~3 s' 25 s before the end, session 45's fresh-user trial)."""
        now = time.perf_counter()
        with self._lock:
            running = [(self.jobs[i].estimate, now - t) for i, t in self._running.items()]
            f = max([self.factor] + [ran / est for est, ran in running if est > 0])
            slots = [max(est * f - ran, self.OVERDUE_SHARE * ran, 0.1 * est * f) for est, ran in running]
            queued = sorted((self.jobs[i].estimate * f for i in range(len(self.jobs))
                             if i not in self._running and i not in self._finished), reverse=True)
        slots += [0.0] * max(0, self.workers - len(slots))
        for cost in queued:
            j = min(range(len(slots)), key=slots.__getitem__)
            slots[j] += cost
        return max(slots, default=0.0)

    def _postfix(self) -> None:
        left = self.running_text()
        self.bar.set_postfix_str(f"{left}, ETA ~{_duration(self.eta())}" if left else "", refresh=True)

    def _line(self, text: str) -> None:
        self._last_line = time.perf_counter()
        try:
            print(f"cutlass_offload: {self.desc}: {text}", file=self.stream, flush=True)
        except (OSError, ValueError):        # a closed pipe must not fail the build
            pass

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.speed_file is not None and self._measured[1] > 0:
            write_speed(self.speed_file, self._measured[0] / self._measured[1] * self.efficiency)


SPEED_RANGE = (0.05, 20.0)     # seconds per estimated second taken as a measurement


def _machine() -> str:
    return f"{socket.gethostname()}:{os.cpu_count() or 1}"


def read_speed(path: Path | None) -> float | None:
    """This machine's seconds per estimated second of a unit compiled alone, as
    ``write_speed`` kept it in ``path``; None when there is none or the file is not
    one ``write_speed`` wrote (a damaged file is not used)."""
    return _speed_of(_speeds(path)) if path is not None else None


def _speeds(path: Path) -> dict:
    """The speed file's {machine: seconds per estimated second}; {} when it is
    missing or not such a JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _speed_of(data: dict) -> float | None:
    v = data.get(_machine())
    return float(v) if isinstance(v, (int, float)) and SPEED_RANGE[0] <= v <= SPEED_RANGE[1] else None


def write_speed(path: Path, measured: float) -> None:
    """Keep ``measured`` for this machine in ``path`` (the mean with the value kept
    before, so one busy build moves it halfway), atomically; never raises."""
    if not SPEED_RANGE[0] <= measured <= SPEED_RANGE[1]:
        return
    data = _speeds(path)
    old = _speed_of(data)
    data[_machine()] = round(measured if old is None else (old + measured) / 2, 4)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        pass
