"""Parallel job runner (no nvcc): results, order, killed processes."""
import sys

from cutlass_offload.build.jobs import Job, run_jobs


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
