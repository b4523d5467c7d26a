"""benchmarks/runtime.py's flow without a GPU: the steps of a model (ours with
Inductor glue plain and reduce-overhead, ours with eager glue), the JSON written
after each, --budget-s stopping between steps and --resume finishing the rest.
CUDA timing is replaced by wall-clock timing on CPU, the model by glue_helpers'
FiveKinds, the library build by nothing (regions run their PyTorch fallback; no nvcc
runs, nothing is written to the kernel cache)."""
import inspect
import json
import sys
import time
from pathlib import Path

import pytest
import torch

import cutlass_offload as co
from cutlass_offload import api
from cutlass_offload.runtime import glue
from glue_helpers import FiveKinds, five_kinds_inputs, regions_on_cpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import runtime  # noqa: E402


class _NoBuild:
    def __init__(self, plan, options):
        self.plan, self.seconds, self.failed = plan, 0.0, None

    def result(self):
        from cutlass_offload.build.result import BuildResult
        return BuildResult(library=None, plan=self.plan, strategy="sharded", seconds=0.0, jobs=1)

    def library(self):
        return None, []


@pytest.fixture
def cpu_run(monkeypatch):
    real_available = torch.cuda.is_available

    def available():          # "a GPU" for runtime.main's check only
        return inspect.stack()[1].filename.endswith("runtime.py") or real_available()
    monkeypatch.setattr(torch.cuda, "is_available", available)
    for name, value in (("synchronize", lambda *a: None), ("empty_cache", lambda: None),
                        ("get_device_name", lambda *a: "CPU")):
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)

    def wall_ms(fn, reps, warmup=1):
        fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps * 1e3
    monkeypatch.setattr(runtime, "events_ms", wall_ms)
    monkeypatch.setattr(runtime, "_graph_or_reason", lambda fn, calls, reps: (None, "CPU"))
    monkeypatch.setattr(runtime, "measure_peaks", lambda reps: {"tflops": 1.0, "gbps": 1.0})
    monkeypatch.setattr(runtime, "host_overheads", lambda groups, rows: [])

    def load_model(name, dtype, batch=None, seq=None):
        if name != "five":
            raise ValueError(f"unknown model {name!r}")
        torch.manual_seed(0)
        return FiveKinds().eval(), five_kinds_inputs(batch or 4)
    monkeypatch.setattr(runtime, "load_model", load_model)
    regions_on_cpu(monkeypatch)
    monkeypatch.setattr(api, "_PendingBuild", _NoBuild)
    # the eager-glue variant builds in the foreground: no nvcc there either (nor an
    # entry in the user's kernel cache)
    monkeypatch.setattr(api.build_stage, "build",
                        lambda plan, strategy, jobs=None, executor=None: _NoBuild(plan, None).result())
    monkeypatch.setattr(api, "_warm_inputs", lambda inputs, options, spec:
                        tuple(inputs) if spec.resolved() == "inductor" else None)
    monkeypatch.setattr(glue, "inductor_available", lambda: True)
    real_compile = co.compile

    def compile_sm90(model, inputs, **kw):
        return real_compile(model, inputs, arch="sm_90a", allow_tf32=True, **kw)
    compile_sm90.__signature__ = inspect.signature(real_compile)
    monkeypatch.setattr(co, "compile", compile_sm90)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


ARGS = ["--no-anchors", "--quick", "--reps", "1", "--max-autotune-models", "none"]


def test_steps_budget_and_resume(cpu_run, tmp_path):
    out = tmp_path / "r.json"
    # a budget spent by the first step (which always starts): stops before the next, JSON kept
    rc = runtime.main(["five", "unknown-model", "--json", str(out), "--budget-s", "0.000001"] + ARGS)
    assert rc == 3
    saved = json.loads(out.read_text())
    assert saved["incomplete"] == "five: ours"
    five = saved["models"][0]
    assert "eager" in five and "ours_inductor" not in five
    eager_s = five["step_s"]["eager"]
    # resume: the eager step is kept (not run again), the rest runs
    rc = runtime.main(["five", "unknown-model", "--json", str(out), "--resume"] + ARGS)
    assert rc == 0
    saved = json.loads(out.read_text())
    five, unknown = saved["models"]
    assert five["step_s"]["eager"] == eager_s             # kept from the first run
    assert set(five["step_s"]) == {"eager", "ours_inductor", "ours_inductor_ro", "heuristic"}
    oi, oro, h = five["ours_inductor"], five["ours_inductor_ro"], five["heuristic"]
    assert oi["glue"] == "inductor" and oi["compiled_during_compile"] is True
    assert oro["mode"] == "reduce-overhead" and oro["compiled_during_compile"] is False
    for v in (oi, oro, h):
        assert v["rel_err_fp32_fresh"] < 1e-5 and v["rel_err_fp32_batch2"] < 1e-5
    assert five["second_batch"] == 2 and h["regions"] == 7 and five["tuned"] == "not run (--quick)"
    assert five["done_when"]["verdict"] == "incomplete: no torch.compile, torch.compile reduce-overhead"
    assert unknown["error"].startswith("ValueError")


def test_no_eager_glue_measures_only_the_inductor_variants(cpu_run, tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    compiles = []
    real = runtime._load_or_compile

    def counted(*args, **kw):
        compiles.append(kw.get("glue"))
        return real(*args, **kw)
    monkeypatch.setattr(runtime, "_load_or_compile", counted)
    assert runtime.main(["five", "--json", str(out), "--no-eager-glue"] + ARGS) == 0
    five = json.loads(out.read_text())["models"][0]
    assert set(five["step_s"]) == {"eager", "ours_inductor", "ours_inductor_ro"}
    assert five["heuristic"] == "not run (--no-eager-glue)"
    assert compiles == ["inductor"]            # no second compile for the eager glue
    assert five["ours_inductor_ro"]["rel_err_fp32_batch2"] < 1e-5


def test_paired_only_compiles_each_variant_once_per_mode(cpu_run, tmp_path, monkeypatch):
    """--paired-only: the anchors' default / reduce-overhead and ours with Inductor
    glue are measured in the paired rounds alone (one torch.compile of the model
    per mode, not two), and the JSON still holds what the report and the verdict
    read: each anchor's ms / compile seconds / error, ours' ms / first call / errors
    at both batch sizes, and the per-round ratios."""
    import _timing
    monkeypatch.setattr(_timing, "events_ms", lambda fn, reps, warmup=1: (fn(), 1.0)[1])
    real = torch.compile
    compiled_models = []

    def counted(model, *args, **kw):
        if isinstance(model, FiveKinds):
            compiled_models.append(kw.get("mode"))
        return real(model, *args, **kw)
    monkeypatch.setattr(torch, "compile", counted)
    out = tmp_path / "r.json"
    args = ["five", "--json", str(out), "--no-eager-glue", "--paired-only", "--paired-rounds", "2",
            "--quick", "--reps", "1", "--max-autotune-models", "none"]
    assert runtime.main(args) == 0
    five = json.loads(out.read_text())["models"][0]
    assert compiled_models == [None, "reduce-overhead"]
    assert set(five["step_s"]) == {"eager", "ours_inductor", "ours_inductor_ro"}
    for mode, ours in (("default", five["ours_inductor"]), ("reduce-overhead", five["ours_inductor_ro"])):
        anchor = five["anchors"][mode]
        assert anchor["ms"] == 1.0 and anchor["compile_s"] > 0 and anchor["rel_err_fp32_fresh"] < 1e-5
        assert ours["ms"] == 1.0 and ours["first_call_s"] > 0 and ours["mode"] == mode
        assert ours["rel_err_fp32_fresh"] < 1e-5 and ours["rel_err_fp32_batch2"] < 1e-5
        assert five["paired"][mode]["ratio"] == 1.0 and len(five["paired"][mode]["ours_ms"]) == 2
    assert five["done_when"]["ratios_from"] == "2 interleaved rounds"
    assert five["done_when"]["verdict"].startswith("MISS")       # 1.0x: neither target met
