"""Parallel job runner (no nvcc): results, order, killed processes."""
import sys

import pytest

from cutlass_offload.build.jobs import Job, run_jobs
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
