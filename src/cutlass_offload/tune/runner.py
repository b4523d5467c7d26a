"""Parent side of profiling: run tune/profile.py in subprocesses, survive crashes.

``profile_candidates`` starts ONE profiling process for all jobs. When it dies
(a CUDA fault, a kill, a hang past the timeout) or stops after a candidate left
a CUDA error, the job that was running is recorded ("crashed", or the error it
reported) and the jobs not yet run go to a fresh process, without the culprit:
one bad kernel never costs the others their result. Each round records at least
one job or stops, so this ends.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ..config import knobs
from ..ir import GemmLaunch
from ..build.scratch import scratch_dir
from .result import CandidateResult

# Seconds: the process imports torch and makes a CUDA context (~10-20 s), then
# each job takes well under a second of GPU time; generous so only hangs hit it.
TIMEOUT_BASE_S = 120.0
TIMEOUT_PER_JOB_S = 10.0
_PACKAGE_PARENT = Path(__file__).resolve().parents[2]     # the folder holding cutlass_offload/


def launch_subprocess(request: Path, results: Path, timeout_s: float) -> tuple:
    """Run the profiling process; (exit status or "timeout", stderr tail).

    cwd is the folder that holds the package, so ``python -m`` finds it whether or
    not it is installed."""
    try:
        proc = subprocess.run([sys.executable, "-m", "cutlass_offload.tune.profile", str(request),
                               str(results)], cwd=_PACKAGE_PARENT, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return "timeout", err[-2000:]
    return proc.returncode, (proc.stderr or "")[-2000:]


def _events(path: Path) -> list:
    """The complete JSON lines of a results file (a line cut by a crash is dropped)."""
    out = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


def _exit_text(rc, stderr: str) -> str:
    if rc == "timeout":
        what = "the profiling process hung (killed at the timeout)"
    elif isinstance(rc, int) and rc < 0:
        what = f"the profiling process died of signal {-rc}"
    else:
        what = f"the profiling process exited with status {rc}"
    tail = [l for l in stderr.strip().splitlines() if l.strip()][-1:]
    return what + (f": {tail[0][:300]}" if tail else "")


def profile_candidates(library, problems: dict, jobs: list, tags: dict, *, device: int = 0,
                       launch=launch_subprocess, knob_search: dict | None = None) -> tuple:
    """Profile every job; returns ({job id: CandidateResult}, {problem id: PyTorch us}).

    library: path of the built profiling library. problems: {problem id: spec}
    (tune/profile.py). jobs: [{"id", "problem", "symbol", "kernel"}, optionally
    "launch" and "variants" (GemmLaunch fields), "always_variants"]. tags: {job id: config tag} for the
    results. knob_search: tune/profile.py's (None: none); each variant it runs adds
    a result under "<job id>@<launch tag>" tagged "<config tag>+<launch tag>".
    launch: how to run one process (tests pass a fake). Never raises for a failing
    candidate or process: those become results.
    Processes of this machine profile one at a time per GPU (a file lock under the
    cache): two tuned compiles side by side would otherwise time each other.
    """
    from filelock import FileLock

    lock_dir = knobs().cache_dir / "tuning"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_dir / f"profile-gpu{device}.lock")):
        return _profile_locked(library, problems, jobs, tags, device, launch, knob_search)


def _variant_result(job, tag, ev) -> CandidateResult:
    return CandidateResult(job["kernel"], f"{tag}+{GemmLaunch(**ev['launch']).tag}", ev["status"],
                           ev.get("us"), ev.get("rel_err"), ev.get("detail", ""), launch=ev["launch"])


def _profile_locked(library, problems, jobs, tags, device, launch, knob_search) -> tuple:
    results, torch_us = {}, {}
    remaining = list(jobs)
    by_id = {j["id"]: j for j in jobs}
    with scratch_dir("cutlass_offload_tune_") as tmp:
        attempt = 0
        while remaining:
            attempt += 1
            req = Path(tmp) / f"request{attempt}.json"
            res = Path(tmp) / f"results{attempt}.jsonl"
            used = {j["problem"] for j in remaining}
            req.write_text(json.dumps({"library": str(library), "device": device,
                                       "problems": {p: s for p, s in problems.items() if p in used},
                                       "jobs": [{k: j[k] for k in ("id", "problem", "symbol",
                                                                   "launch", "variants", "always_variants")
                                                  if k in j}
                                                for j in remaining],
                                       "knob_search": knob_search}))
            rc, stderr = launch(req, res, TIMEOUT_BASE_S + TIMEOUT_PER_JOB_S * len(remaining))
            before = len(results)
            running, setup = None, None
            for ev in _events(res):
                kind = ev.get("event")
                if kind == "setup":
                    setup, running = ev["problem"], None
                elif kind == "torch":
                    torch_us[ev["problem"]] = ev["us"]
                    setup = None
                elif kind == "start":
                    running = ev["job"]
                elif kind == "done":
                    running = None
                    if ev.get("base") is not None:          # a launch-knob variant
                        results[ev["job"]] = _variant_result(by_id[ev["base"]], tags[ev["base"]], ev)
                        continue
                    job = by_id[ev["job"]]
                    results[job["id"]] = CandidateResult(
                        job["kernel"], tags[job["id"]], ev["status"], ev.get("us"), ev.get("rel_err"),
                        ev.get("detail", ""), launch=job.get("launch"))
            if rc == 0 and all(j["id"] in results for j in remaining):
                break
            why = _exit_text(rc, stderr)
            if running is not None:                  # the culprit: skip it from now on
                base = running.split("@")[0]           # a variant's crash ends its knob search
                tag = tags[base] + (running[len(base):].replace("@", "+", 1))
                results[running] = CandidateResult(by_id[base]["kernel"], tag, "crashed", detail=why)
            elif setup is not None:                  # died making a problem's inputs
                for j in remaining:
                    if j["problem"] == setup and j["id"] not in results:
                        results[j["id"]] = CandidateResult(j["kernel"], tags[j["id"]], "not profiled",
                                                           detail=why)
            remaining = [j for j in remaining if j["id"] not in results]
            if len(results) == before:               # no progress: the profiler itself fails
                for j in remaining:
                    results[j["id"]] = CandidateResult(j["kernel"], tags[j["id"]], "not profiled",
                                                       detail=why)
                break
    return results, torch_us
