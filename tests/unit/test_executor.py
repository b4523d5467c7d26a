"""Build executors without nvcc or a cluster: selection, the error without Ray,
portable commands, resource hints, fallbacks and report fields."""
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cutlass_offload.build import executor as ex
from cutlass_offload.build import toolchain
from cutlass_offload.build.result import BuildResult, UnitReport
from cutlass_offload.build.shards import peak_memory
from cutlass_offload.config import CompileOptions
from cutlass_offload.errors import ToolchainError

ID = ex.ToolchainId("Build cuda_13.0.r13.0/compiler.1_0", "4.2.0+abc", "sm80")


def _kernel(family, kind="gemm"):
    config = SimpleNamespace(family=family, tile=(128, 128, 64), cluster=(1, 1, 1), stages=0,
                             kernel_schedule="", warp=(0, 0, 0))
    return SimpleNamespace(kind=kind, config=config, dtype="f16", layout_a="row", layout_b="col",
                           align_a=8, align_b=8, align_c=8)


def test_executor_selection():
    assert isinstance(ex.make_executor(), ex.LocalExecutor)
    assert isinstance(ex.make_executor("local"), ex.LocalExecutor)
    with pytest.raises(ValueError, match="local, ray"):
        ex.make_executor("dask")
    with pytest.raises(ValueError, match="executor"):
        CompileOptions(executor="dask")
    with pytest.raises(ValueError, match="ray_address"):
        CompileOptions(ray_address="127.0.0.1:6379")
    assert CompileOptions(executor="ray", ray_address="auto").ray_address == "auto"


def test_ray_executor_without_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)          # import ray -> ImportError
    with pytest.raises(ToolchainError, match=r"pip install 'cutlass_offload\[ray\]'"):
        ex.make_executor("ray")


def test_cli_executor_ray_without_ray_is_one_clear_line(monkeypatch, capsys, tmp_path):
    from cutlass_offload import cli
    monkeypatch.setitem(sys.modules, "ray", None)
    rc = cli.main(["compile", "mlp", "--out", str(tmp_path / "o"), "--arch", "sm_80", "--executor", "ray"])
    assert rc == 2
    assert "cutlass_offload[ray]" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_resource_hints_per_family():
    assert peak_memory([_kernel("cutlass3x_sm90")]) == 4.5 * 2**30
    assert peak_memory([_kernel("cutlass2x_sm80")]) == 2.0 * 2**30
    assert peak_memory([_kernel("cutlass2x_sm80", "attention")]) == 0.6 * 2**30
    # a unit's largest family, plus what each further kernel's instantiation holds
    assert peak_memory([_kernel("rowwise_norm"), _kernel("cutlass3x_sm90")]) == 4.55 * 2**30
    assert peak_memory([]) == 0.5 * 2**30                   # launchers


def test_task_command_is_portable_and_localizes_to_the_local_command():
    task = ex.CompileTask.make("shard", "// src", "sm80", True, ID, 2 * 2**30)
    root = str(toolchain.cutlass_root())
    assert not any(root in a for a in task.command)
    assert any(a.startswith(ex.CUTLASS) for a in task.command)
    local = toolchain.compile_command("/x/nvcc", "sm80", "/s/unit.cu", "/s/unit.o", True)
    assert task.localized("/x/nvcc", "/s/unit.cu", "/s/unit.o") == local
    plain = ex.CompileTask.make("launchers", "// src", "sm80", False, ID, 2**29)
    assert plain.localized("nvcc", "a.cu", "a.o") == toolchain.compile_command("nvcc", "sm80", "a.cu", "a.o", False)


def test_worker_refuses_another_toolchain_before_compiling(monkeypatch):
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: "/opt/old/nvcc")
    monkeypatch.setattr(toolchain, "nvcc_version", lambda nvcc: "Build cuda_12.0.r12.0/compiler.0_0")
    monkeypatch.setattr(toolchain, "cutlass_version", lambda: ID.cutlass_version)
    monkeypatch.setattr(ex, "run_job", lambda job: pytest.fail("compiled with a mismatched nvcc"))
    task = ex.CompileTask.make("shard", "// src", "sm80", False, ID, 2**29)
    with pytest.raises(ex.ToolchainMismatch, match="cuda_12.0"):
        ex.compile_on_worker(task)


class _FakeRay:
    """Just enough of the ray module for RayExecutor: one cluster, scripted results."""

    class exceptions:
        class RayError(Exception):
            pass

        class RayTaskError(RayError):
            def __init__(self, cause):
                super().__init__("task failed")
                self.cause = cause

        class GetTimeoutError(RayError, TimeoutError):
            pass

    def __init__(self, outcome, memory=64 * 2**30):
        self.outcome, self.memory, self.options_seen = outcome, memory, []

    def is_initialized(self):
        return True

    def nodes(self):
        return [{"Alive": True, "Resources": {"CPU": 4.0, "memory": float(self.memory)}}]

    def cluster_resources(self):
        return {"CPU": 8.0}

    def remote(self, fn):
        ray = self

        class Remote:
            def options(self, **kw):
                ray.options_seen.append(kw)
                return SimpleNamespace(remote=lambda task: task)
        return Remote()

    def get(self, task, timeout=None):
        self.timeout_seen = timeout
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome

    def cancel(self, ref, force=False):
        self.cancelled = (ref, force)


class _FakeLocal:
    def compile(self, task, staging):
        (staging / "unit.o").write_bytes(b"local")
        from cutlass_offload.build.jobs import JobResult
        return JobResult(task.name, True, 1.0, 1, "", task.kernels, executor="local"), ["nvcc"]


def _ray_executor(monkeypatch, fake):
    monkeypatch.setattr(ex, "import_ray", lambda: fake)
    return ex.RayExecutor("127.0.0.1:1", local=_FakeLocal())


def test_ray_task_asks_one_cpu_and_the_family_memory_and_publishes_the_bytes(monkeypatch, tmp_path):
    fake = _FakeRay({"ok": True, "seconds": 3.0, "peak_rss": 5, "log": "fine", "object": b"\x7fELF..",
                     "killed": False, "host": "w1"})
    rex = _ray_executor(monkeypatch, fake)
    task = ex.CompileTask.make("shard", "// src", "sm80", False, ID, peak_memory([_kernel("cutlass3x_sm90")]))
    res, _ = rex.compile(task, tmp_path)
    assert fake.options_seen[0]["num_cpus"] == 1 and fake.options_seen[0]["memory"] == int(4.5 * 2**30)
    assert fake.options_seen[0]["retry_exceptions"] is False
    assert (tmp_path / "unit.o").read_bytes() == b"\x7fELF.." and (tmp_path / "nvcc.log").read_text() == "fine"
    assert res.ok and res.seconds == 3.0 and res.executor == "ray (w1)"
    assert rex.slots() == 8


@pytest.mark.parametrize("outcome, why", [
    ("mismatch", "local (ray: ToolchainMismatch: worker w has nvcc"),
    ("crash", "local (ray: RayError: worker died"),
    ("killed", "local (ray: nvcc killed on w1)"),
    ("no room", "local (ray: no node with a CPU and 2.0 GiB"),
])
def test_ray_failures_build_the_unit_here(monkeypatch, tmp_path, outcome, why):
    ray_ex = _FakeRay.exceptions
    result = {"mismatch": ray_ex.RayTaskError(ex.ToolchainMismatch("worker w has nvcc 12.0")),
              "crash": ray_ex.RayError("worker died unexpectedly\nmore"),
              "killed": {"ok": False, "seconds": 1.0, "peak_rss": 0, "log": "", "object": None,
                         "killed": True, "host": "w1"},
              "no room": None}[outcome]
    fake = _FakeRay(result, memory=2**30 if outcome == "no room" else 64 * 2**30)
    task = ex.CompileTask.make("shard", "// src", "sm80", False, ID, 2 * 2**30)
    res, _ = _ray_executor(monkeypatch, fake).compile(task, tmp_path)
    assert res.ok and res.executor.startswith(why), res.executor
    assert (tmp_path / "unit.o").read_bytes() == b"local"


def test_report_shows_the_executor():
    unit = UnitReport("shard_sm80_gemm_f16_1k", ("k",), 12.0, False, True, 800.0, "/c/unit.cu", "",
                      "local (ray: ToolchainMismatch: x)")
    res = BuildResult(Path("/c/lib.so"), None, "sharded", 13.0, 1, [unit])
    assert res.to_dict()["units"][0]["executor"] == "local (ray: ToolchainMismatch: x)"
    assert "local (ray: ToolchainMismatch: x)" in res.format()
    from cutlass_offload.report import Report
    rep = Report("sm80", build=res.to_dict())
    assert "[local (ray: ToolchainMismatch: x)]" in rep.format()


def test_a_hung_task_is_cancelled_and_built_here(monkeypatch, tmp_path):
    fake = _FakeRay(_FakeRay.exceptions.GetTimeoutError("Get timed out"))
    task = ex.CompileTask.make("shard", "// src", "sm80", False, ID, 2**30)
    rex = _ray_executor(monkeypatch, fake)
    rex.task_timeout = 5.0
    res, _ = rex.compile(task, tmp_path)
    assert fake.timeout_seen == 5.0 and fake.cancelled == (task, True)
    assert res.ok and res.executor == "local (ray: no result within 5 s)"
    assert (tmp_path / "unit.o").read_bytes() == b"local"
