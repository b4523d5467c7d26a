"""Parallel job runner (no nvcc): results, order, killed processes."""
import json
import sys

import pytest

from cutlass_offload.build.jobs import Job, JobResult, run_jobs
from cutlass_offload.errors import CompileError


def test_results_in_job_order_with_memory_and_time(tmp_path):
    jobs = [Job(f"j{i}", [sys.executable, "-c", f"import time; time.sleep({0.2 * (3 - i)}); print({i})"],
                (f"k{i}",), estimate=i, log_path=tmp_path / f"{i}.log") for i in range(3)]
    res = run_jobs(jobs, workers=2)
    assert [r.name for r in res] == ["j0", "j1", "j2"]
    assert all(r.ok and r.peak_rss > 1 << 20 for r in res)
    assert [r.log.strip() for r in res] == ["0", "1", "2"]
    assert res[0].seconds >= 0.5


def test_failure_and_kill_are_reported(tmp_path):
    fail = Job("fail", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
               log_path=tmp_path / "f.log")
    kill = Job("kill", [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
               log_path=tmp_path / "k.log")
    f, k = run_jobs([fail, kill], workers=2)
    assert not f.ok and not f.killed and "boom" in f.log
    assert not k.ok and k.killed and "out of memory?" in k.log


def test_a_tool_interrupted_inside_nvcc_counts_as_killed(tmp_path):
    """nvcc exits 2 when cudafe++/cicc die by a signal (Ctrl-C on the process group):
    that must not be cached as a compile failure."""
    nvcc_like = Job("int", [sys.executable, "-c",
                            "import sys; print(\"nvcc error   : 'cudafe++' died due to signal 2\"); "
                            "sys.exit(2)"], log_path=tmp_path / "i.log")
    (r,) = run_jobs([nvcc_like], workers=1)
    assert not r.ok and r.killed


def test_interrupted_build_is_not_cached_as_a_failure(tmp_path, monkeypatch):
    """A compile killed by a signal leaves no failure entry: the next build compiles again."""
    import torch
    from cutlass_offload.build import build, toolchain
    from cutlass_offload.build.cache import BuildCache
    from cutlass_offload.capture import capture
    from cutlass_offload.partition import partition
    from cutlass_offload.select import select
    model = torch.nn.Linear(16, 16).half()
    plan = select(partition(capture(model, (torch.randn(4, 16).half(),)).graph_module), "sm80")
    interrupted = [sys.executable, "-c",            # what nvcc does when Ctrl-C kills cudafe++
                   "import sys; print(\"nvcc error   : 'cudafe++' died due to signal 2\"); sys.exit(2)"]
    monkeypatch.setattr(toolchain, "compile_command", lambda *a, **k: interrupted)
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: sys.executable)
    monkeypatch.setattr(toolchain, "nvcc_version", lambda nvcc: "test")
    cache = BuildCache(tmp_path / "cache")
    with pytest.raises(CompileError):                 # the launchers were interrupted too
        build(plan, "sharded", cache)
    failed_entries = [m for m in (tmp_path / "cache").rglob("meta.json")
                      if '"ok": false' in m.read_text()]
    assert not failed_entries


def _sleepers(tmp_path, kernels_per_job=(3, 1, 0), seconds=(1.5, 0.2, 0.1)):
    """Jobs that sleep; the last, without kernels, stands for the launchers."""
    names = [f"u{i}" for i in range(len(kernels_per_job) - 1)] + ["launchers"]
    return [Job(name, [sys.executable, "-c", f"import time; time.sleep({s})"],
                tuple(f"{name}k{j}" for j in range(n)), estimate=s * 10, log_path=tmp_path / f"{name}.log")
            for name, n, s in zip(names, kernels_per_job, seconds)]


def test_piped_progress_is_one_line_per_finished_unit(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUTLASS_OFFLOAD_PROGRESS", "auto")      # stderr is no terminal here
    run_jobs(_sleepers(tmp_path), workers=2, desc="compiling shards")
    lines = capsys.readouterr().err.strip().splitlines()
    assert all(line.startswith("cutlass_offload: compiling shards: ") for line in lines)
    assert "4 kernels in 2 units, plus the launchers unit, 2 at a time; ETA ~" in lines[0]
    done = lines[1:]
    assert len(done) == 3                                       # one per unit, the launchers too
    # u0 (1.5 s) and u1 run first; the launchers take u1's slot and add no kernel
    assert [line.split("] ")[0].split("[")[1] for line in done] == ["1/4 kernels", "1/4 kernels",
                                                                      "4/4 kernels"]
    assert "u1 compiled in" in done[0] and "launchers compiled in" in done[1]
    assert all("running u0 (" in line and "ETA ~" in line for line in done[:2])
    assert "u0 compiled in" in done[2] and "done in" in done[2]


def test_progress_bar_counts_kernels_not_the_launchers(tmp_path):
    import io

    from cutlass_offload.build.jobs import Progress
    jobs = _sleepers(tmp_path)
    stream = io.StringIO()
    p = Progress(jobs, 2, "compiling shards", mode="bar", stream=stream)
    assert p.bar.total == 4
    p.started(0)
    p.started(2)
    p.finished(2, run_jobs([jobs[2]], 1)[0])
    assert p.bar.n == 0                                         # the launchers count no kernel
    p.tick()
    assert "running u0" in stream.getvalue() and "ETA ~" in stream.getvalue()
    p.finished(0, run_jobs([jobs[0]], 1)[0])
    assert p.bar.n == 3
    p.close()
    assert "3/4 kernels" in stream.getvalue()


def test_quiet_and_kernelless_runs_print_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUTLASS_OFFLOAD_PROGRESS", "off")       # what compile -q sets
    run_jobs(_sleepers(tmp_path), workers=2)
    monkeypatch.setenv("CUTLASS_OFFLOAD_PROGRESS", "lines")
    run_jobs(_sleepers(tmp_path, (0,), (0.1,)), workers=1)      # the launchers alone: seconds
    assert capsys.readouterr().err == ""


def test_eta_scales_the_estimates_by_what_units_took_here(tmp_path):
    from cutlass_offload.build.jobs import JobResult, Progress
    jobs = [Job(f"u{i}", [], (f"k{i}",), estimate=10.0) for i in range(4)]
    p = Progress(jobs, 2, "x", mode="off")
    p.factor = 1.0
    assert p.eta() == pytest.approx(20.0)                       # 4 x 10 s on 2 slots
    p.started(0)
    p.finished(0, JobResult("u0", True, 30.0, 0, "", ("k0",)))   # 3x slower here than estimated
    assert p.factor == pytest.approx(3.0)
    assert p.eta() == pytest.approx(60.0)                       # 3 x 30 s left on 2 slots


def test_first_eta_on_few_cores_is_near_the_2core_builds(monkeypatch):
    """Before any unit finished here, fewer than 8 cores scale the estimates (build/
    shards.py's rows: 2-core seconds of one unit compiled by a plain nvcc -c) by
    FEW_CORES_FACTOR for the build's overlapped nvcc steps: mlp's one sm_80 unit (3
    GEMM kernels) built in 6.1 s on 2 cores (session 42), its sm_90a one in 33-35 s;
    the ETAs said 18 s and 84 s with the older rows and factor."""
    from cutlass_offload.build import jobs as jobs_mod
    from cutlass_offload.build import shards
    from cutlass_offload.build.jobs import Progress

    def first_eta(family, kernels=3, cores=2):
        fixed, mainloop, _ = shards.COST[family]
        jobs = [Job("shard", [], tuple("abc"[:kernels]), estimate=fixed + kernels * mainloop),
                Job("launchers", [], (), estimate=1.0)]
        monkeypatch.setattr(jobs_mod.os, "cpu_count", lambda: cores)
        return Progress(jobs, 2, "x", mode="off").eta(), fixed + kernels * mainloop

    eta, estimate = first_eta("cutlass2x_sm80")
    assert Progress.FEW_CORES_FACTOR == pytest.approx(0.8) and eta == pytest.approx(0.8 * estimate)
    assert 6.1 / 1.5 <= eta <= 6.1 * 1.5
    eta, _ = first_eta("cutlass3x_sm90")
    assert 34.0 / 1.5 <= eta <= 34.0 * 1.5
    eta, estimate = first_eta("cutlass2x_sm80", cores=16)
    assert eta == pytest.approx(estimate)                      # many cores: the rows as they are


def test_first_eta_counts_units_side_by_side_on_few_cores(monkeypatch):
    """Two units compiling at once on 2 cores each run slower than alone
    (shards.concurrency_efficiency): the first ETA divides by it, and only when more
    than one unit with kernels can run at once."""
    from cutlass_offload.build import jobs as jobs_mod
    from cutlass_offload.build import shards
    from cutlass_offload.build.jobs import Progress
    monkeypatch.setattr(jobs_mod.os, "cpu_count", lambda: 2)
    four = [Job(f"u{i}", [], (f"k{i}",), estimate=10.0) for i in range(4)]
    alone = 2 * 10.0 * Progress.FEW_CORES_FACTOR                # 4 units on 2 slots
    assert Progress(four, 2, "x", mode="off").eta() == pytest.approx(alone / shards.concurrency_efficiency(2))
    assert Progress(four, 1, "x", mode="off").eta() == pytest.approx(2 * alone)
    one = [Job("u", [], ("k",), estimate=10.0), Job("launchers", [], (), estimate=1.0)]
    assert Progress(one, 2, "x", mode="off").eta() == pytest.approx(10.0 * Progress.FEW_CORES_FACTOR)


def test_the_first_eta_starts_from_this_machines_measured_speed(tmp_path, monkeypatch):
    """A build keeps its seconds per estimated second (per unit compiled alone) in the
    cache's speed file for this host and core count; the next build's first ETA starts
    from it. A damaged or out-of-range file is not used; another machine's entry is kept."""
    from cutlass_offload.build import jobs as jobs_mod
    from cutlass_offload.build import shards
    from cutlass_offload.build.jobs import JobResult, Progress, read_speed, write_speed
    monkeypatch.setattr(jobs_mod.os, "cpu_count", lambda: 2)
    speed = tmp_path / "build_speed.json"
    four = [Job(f"u{i}", [], (f"k{i}",), estimate=10.0) for i in range(4)]
    eff = shards.concurrency_efficiency(2)
    p = Progress(four, 2, "x", mode="off", speed_file=speed)
    assert p.eta() == pytest.approx(2 * 10.0 * Progress.FEW_CORES_FACTOR / eff)   # nothing kept yet
    for i in range(4):
        p.started(i)
        p.finished(i, JobResult(f"u{i}", True, 50.0, 0, "", (f"k{i}",)))      # 5 s per estimated s
    p.close()
    assert read_speed(speed) == pytest.approx(5.0 * eff, rel=1e-3)
    again = Progress(four, 2, "x", mode="off", speed_file=speed)
    assert again.eta() == pytest.approx(2 * 10.0 * 5.0, rel=1e-3)            # this machine's speed
    write_speed(speed, 1.0 * eff)                                             # one fast build: halfway
    assert read_speed(speed) == pytest.approx(3.0 * eff, rel=1e-3)
    data = json.loads(speed.read_text())
    speed.write_text(json.dumps({**data, "otherhost:64": 0.5}))
    write_speed(speed, 3.0 * eff)
    assert json.loads(speed.read_text())["otherhost:64"] == 0.5
    for bad in ("{not json", '["a list"]', json.dumps({k: 1e6 for k in data})):
        speed.write_text(bad)
        assert read_speed(speed) is None
        assert Progress(four, 2, "x", mode="off", speed_file=speed).eta() == pytest.approx(
            2 * 10.0 * Progress.FEW_CORES_FACTOR / eff)
    write_speed(speed, 2.0)                                                   # replaces the damaged file
    assert read_speed(speed) == pytest.approx(2.0)


def test_cuda_include_dir_from_nvcc_dryrun_or_beside_it(tmp_path):
    """The launchers' host compile finds cuda_runtime.h through nvcc (a wrapper script
    included) or beside it; a stand-in without headers gives None (nvcc then compiles)."""
    from cutlass_offload.build import toolchain

    toolkit = tmp_path / "cuda"
    (toolkit / "targets" / "x86_64-linux" / "include").mkdir(parents=True)
    (toolkit / "targets" / "x86_64-linux" / "include" / "cuda_runtime.h").write_text("")
    (toolkit / "bin").mkdir()
    real = toolkit / "bin" / "nvcc"
    real.write_text(f'#!/bin/sh\necho \'#$ INCLUDES="-I{toolkit}/bin/../targets/x86_64-linux/include"\' >&2\n')
    real.chmod(0o755)
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    toolchain.cuda_include_dir.cache_clear()
    found = toolchain.cuda_include_dir(str(wrapper))
    assert found is not None and (toolchain.Path(found) / "cuda_runtime.h").is_file()
    bare = tmp_path / "bare" / "bin" / "nvcc"
    bare.parent.mkdir(parents=True)
    bare.write_text("#!/bin/sh\nexit 1\n")
    bare.chmod(0o755)
    assert toolchain.cuda_include_dir(str(bare)) is None
    cmd = toolchain.host_compile_command("c++", found, "u.cu", "u.o")
    assert cmd[:3] == ["c++", "-x", "c++"] and ["-I", found] == cmd[cmd.index("-I"):cmd.index("-I") + 2]


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler for the test, whatever an earlier test or library
    left installed (interrupt_main() does nothing under SIG_IGN / SIG_DFL: one CI run
    saw no KeyboardInterrupt in the test below after the whole suite before it)."""
    import signal
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_an_interrupt_starts_no_queued_job(tmp_path, python_sigint):
    """Ctrl-C while jobs run: KeyboardInterrupt reaches the caller once the running
    job ends, and the queued jobs never start (no nvcc keeps compiling after it)."""
    import _thread
    ran = []

    def runner(job):
        ran.append(job.name)
        if len(ran) == 1:
            _thread.interrupt_main()          # what Ctrl-C does to the main thread
            import time
            time.sleep(0.3)
        return JobResult(job.name, True, 0.0, 0, "", job.kernels)
    jobs = [Job(f"j{i}", ["true"], (f"k{i}",), estimate=10 - i, log_path=tmp_path / f"{i}.log")
            for i in range(4)]
    with pytest.raises(KeyboardInterrupt):
        run_jobs(jobs, workers=1, runner=runner)
    assert ran == ["j0"]


def test_a_compile_error_during_an_interrupt_is_not_a_result(tmp_path, python_sigint):
    """A terminal's Ctrl-C reaches nvcc's tools too: cicc and cudafe++ then exit 4 with
    "Compilation terminated", a compile error by its look (a fresh-user trial found the
    interrupted unit cached as failed, and the next build isolating its kernels). A
    failure of a unit that was running when the build was interrupted is transient."""
    import _thread
    import time

    from cutlass_offload.build.jobs import mark_interrupted
    seen = []

    def runner(job):
        _thread.interrupt_main()                     # the main thread's share of Ctrl-C
        time.sleep(0.1)                              # the tool's exit after its own
        res = JobResult(job.name, False, 0.0, 0, "[cudafe] exit 4\nCompilation terminated.\n", job.kernels)
        seen.append(mark_interrupted(res))
        return res
    with pytest.raises(KeyboardInterrupt):
        run_jobs([Job("u", ["true"], ("k",), log_path=tmp_path / "u.log")], workers=1, runner=runner)
    # the interrupt may come while the pool starts the job's thread, which the pool then
    # does not wait for (the job still ends on its own, as nvcc does after Ctrl-C)
    for _ in range(50):
        if seen:
            break
        time.sleep(0.05)
    assert seen == [True]
    # the next build starts clean: a real compile error is one again, and a success never changes
    (ok,) = run_jobs([Job("ok", [sys.executable, "-c", "pass"], log_path=tmp_path / "ok.log")], workers=1)
    error = JobResult("e", False, 0.0, 0, "error: expected a ';'", ())
    assert not mark_interrupted(error, wait=0.0) and not error.killed
    assert not mark_interrupted(ok, wait=0.0) and ok.ok


def test_the_cli_says_an_interrupt_left_nothing_half_built(monkeypatch, capsys):
    from cutlass_offload import cli

    def interrupted(a):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "_cmd_cache", interrupted)
    assert cli.main(["cache", "info"]) == 130
    err = capsys.readouterr().err
    assert err.startswith("interrupted:") and "Traceback" not in err



def test_the_launchers_slot_is_not_taken_by_a_third_cutlass_unit():
    """A build runs its CUTLASS units ``jobs`` at a time plus the launchers in a slot
    of their own; once the launchers are done, that slot must stay empty (three
    7-kernel sm90a units at once stalled a 2-core 24 GiB machine, session 31)."""
    import threading
    import time
    lock, running, peak, first = threading.Lock(), [0], [0], []

    def runner(job):
        with lock:
            first.append(job.name)
            if job.kernels:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
        time.sleep(0.15 if job.kernels else 0.01)
        with lock:
            if job.kernels:
                running[0] -= 1
        return JobResult(job.name, True, 0.1, 0, "", job.kernels)
    units = [Job(f"shard{i}", [], (f"k{i}",), 10.0 - i) for i in range(5)]
    launchers = Job("launchers", [], (), 1.0)
    res = run_jobs(units + [launchers], workers=3, runner=runner,
                   heavy=lambda j: bool(j.kernels), heavy_limit=2)
    assert all(r.ok for r in res) and [r.name for r in res] == [j.name for j in units + [launchers]]
    assert peak[0] == 2                     # 3 with the launchers' slot handed on
    assert first[0] == "launchers"          # light jobs first: beside the units, not after


def test_a_unit_running_past_its_estimate_raises_the_eta(monkeypatch):
    """A loaded machine: both units started together, neither finished, one has run twice
    its estimate. The ETA must not shrink towards zero (the floor was 10% of the
    estimate), and the queued unit is scaled by the slowness seen so far."""
    from cutlass_offload.build import jobs as jobs_mod
    from cutlass_offload.build.jobs import Progress
    jobs = [Job(f"u{i}", [], (f"k{i}",), estimate=10.0) for i in range(3)]
    p = Progress(jobs, 2, "x", mode="off")
    p.factor = 1.0
    clock = [100.0]
    monkeypatch.setattr(jobs_mod.time, "perf_counter", lambda: clock[0])
    p.started(0)
    p.started(1)
    clock[0] += 5.0                          # on time: 5 s left each, then u2's 10 s
    assert p.eta() == pytest.approx(15.0)
    clock[0] += 15.0                         # 20 s: twice the estimate, nothing finished
    # each running unit its share of the 20 s it ran, then u2 at twice its estimate
    assert p.eta() == pytest.approx(Progress.OVERDUE_SHARE * 20.0 + 2.0 * 10.0)
