"""The dry run (dry_run.py, build/preview.py, ``compile --dry-run``): compile's report
before its build and the build's units, each cached or to compile, without compiling
or writing anything. The builds it is checked against use the fake nvcc
(tests/fake_nvcc.py): no GPU, no CUDA."""
import json

import pytest
import torch
import torch.nn as nn

import cutlass_offload as co
from cutlass_offload import cli
from cutlass_offload.api import resolve_arch
from cutlass_offload.capture import capture
from cutlass_offload.front import compile_options
from cutlass_offload.partition import partition
from cutlass_offload.partition.flops import node_flops
from cutlass_offload.partition.graph_utils import module_paths
from cutlass_offload.report import Report
from cutlass_offload.runtime.glue import GlueSpec
from cutlass_offload.select import select
from fault_helpers import fake_env, nvcc_calls

ARCHS = ["sm_90a", "sm_80"]


class ConvMLP(nn.Module):
    """A conv and two fp16 linears (regions), and an fp32 head: without TF32 a
    fallback with its reason."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1).half()
        self.fc = nn.Linear(16 * 8 * 8, 64).half()
        self.mid = nn.Linear(64, 64).half()
        self.head = nn.Linear(64, 16)

    def forward(self, x):
        h = torch.relu(self.fc(torch.relu(self.conv(x)).flatten(1)))
        return self.head(torch.nn.functional.gelu(self.mid(h)).float())


def _model():
    torch.manual_seed(0)
    return ConvMLP().train(), (torch.randn(4, 8, 8, 8, dtype=torch.float16),)


def _files(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in root.rglob("*")) if root.exists() else None


def _plain(rep: Report) -> dict:
    return {k: rep.to_dict()[k] for k in ("arch", "regions", "fallbacks", "kernels", "flops")}


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    env = fake_env(tmp_path / "tool")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return tmp_path / "tool"


@pytest.mark.parametrize("arch", ARCHS)
def test_the_report_is_the_partition_and_select_paths(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    model, inputs = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dry = co.explain(model, inputs, arch=arch)
    # the user's model: in eval mode, as compile leaves it, and nothing else changed
    assert not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    options = compile_options(GlueSpec(), arch=resolve_arch(arch))
    gm = capture(model, inputs).graph_module
    part = partition(gm, options)
    plan = select(part, options.arch, options)
    assert _plain(dry.report) == _plain(Report.from_plan(plan, node_flops(gm), module_paths(gm)))
    assert dry.fallbacks and all(f["reason"] for f in dry.fallbacks)
    assert [f["node"] for f in dry.fallbacks] == [f.node for f in plan.fallbacks]
    assert len(dry.regions) == len(plan.regions) == 3
    # printed as compile prints its report, then the build's summary
    text = str(dry)
    assert text.startswith(dry.report.format()) and "fallback" in text and "TF32 not allowed" in text
    assert (f"3 kernels in {len(dry.build.units)} units: 0 cached, {len(dry.build.units)} to compile"
            in text)
    assert not (tmp_path / "cache").exists()         # nothing written, not even the folder
    assert json.loads(json.dumps(dry.to_dict()))["build"]["kernels"] == 3


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("strategy", ["sharded", "single", "per-region"])
def test_the_units_are_the_builds_and_a_build_makes_them_cached(arch, strategy, fake_nvcc):
    model, inputs = _model()
    cache = fake_nvcc / "cache"      # fake_env's CUTLASS_OFFLOAD_CACHE_DIR
    dry = co.explain(model, inputs, arch=arch, build_strategy=strategy)
    assert dry.build.units and not dry.build.cached and dry.build.library_cached is False
    assert _files(cache) is None and nvcc_calls(fake_nvcc) == []
    compiled = co.compile(model, inputs, arch=arch, build_strategy=strategy)
    built = compiled.report.build["units"]
    assert (sorted((u.name, sorted(u.kernels)) for u in dry.build.units)
            == sorted((u["name"], sorted(u["kernels"])) for u in built))
    assert _plain(dry.report) == _plain(compiled.report)
    calls, files = nvcc_calls(fake_nvcc), _files(cache)
    again = co.explain(model, inputs, arch=arch, build_strategy=strategy)
    assert nvcc_calls(fake_nvcc) == calls and _files(cache) == files     # nothing compiled or written
    assert [u.cached for u in again.build.units] == [True] * len(built) and again.build.library_cached
    assert "0 to compile; the library is cached too" in str(again)


def test_a_unit_of_an_earlier_build_serves_a_new_model(fake_nvcc, monkeypatch):
    """The kernel index (build/__init__.py ``_cached_shard_of``): the shard another
    model compiled is cached for this one; only the new kernel and the launchers
    compile, as the build then does."""
    monkeypatch.setenv("CUTLASS_OFFLOAD_JOBS", "2")       # the shard plan of any machine
    torch.manual_seed(0)
    small = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)).half()
    x = (torch.randn(4, 32, dtype=torch.float16),)
    co.compile(small, x, arch="sm_80")
    bigger = nn.Sequential(*small, nn.Linear(32, 48), nn.GELU()).half()
    dry = co.explain(bigger, x, arch="sm_80")
    state = {u.name: (u.cached, len(u.kernels)) for u in dry.build.units}
    assert sorted(state.values()) == [(False, 0), (False, 1), (True, 2)], state
    assert "3 kernels in 3 units: 1 cached, 2 to compile" in str(dry)
    built = co.compile(bigger, x, arch="sm_80").report.build["units"]
    assert {u["name"]: (u["cache_hit"], len(u["kernels"])) for u in built} == state
    # the other way round: the first shard serves a model that uses part of it,
    # and its line says how many of the unit's kernels are this model's
    other = nn.Sequential(nn.Linear(32, 64), nn.ReLU()).half()
    lines = [ln for ln in str(co.explain(other, x, arch="sm_80")).splitlines() if " of its " in ln]
    assert len(lines) == 1 and "1 of its 2 kernels" in lines[0] and lines[0].endswith("cached"), lines


def test_without_nvcc_the_units_are_listed_unchecked(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_NVCC", str(tmp_path / "no_nvcc"))
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    model, inputs = _model()
    dry = co.explain(model, inputs, arch="sm_80")
    assert dry.build.units and all(u.cached is None for u in dry.build.units)
    assert "CUTLASS_OFFLOAD_NVCC" in dry.build.toolchain_error
    assert "3 kernels in 2 units: the cache not checked" in str(dry)


def test_bad_inputs_raise_as_compile_does(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    model, inputs = _model()
    with pytest.raises(TypeError, match="torch.nn.Module"):
        co.explain(lambda x: x, inputs, arch="sm_80")
    with pytest.raises(TypeError, match="example_inputs"):
        co.explain(model, {"x": inputs[0]}, arch="sm_80")
    with pytest.raises(ValueError, match="unknown arch"):
        co.explain(model, inputs, arch="sm_70")
    with pytest.raises(ValueError, match="build_strategy"):
        co.explain(model, inputs, arch="sm_80", build_strategy="fast")

    class Broken(nn.Module):
        def forward(self, x):
            raise RuntimeError("the model's own error")
    with pytest.raises(co.CaptureError, match="the model's own error"):
        co.explain(Broken(), inputs, arch="sm_80")
    with pytest.raises(co.CutlassOffloadError, match="strict mode"):
        co.explain(model, inputs, arch="sm_80", strict=True)
    assert not (tmp_path / "cache").exists()


def test_cli_dry_run_prints_the_report_and_the_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "dry.json"
    assert cli.main(["compile", "mlp", "--arch", "sm_90a", "--batch", "2", "--seq", "16",
                     "--dry-run", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("target sm_90a: 3 regions offloaded")
    assert "build (sharded" in text and "3 kernels in" in text and "0 cached" in text
    assert "\nphases: model " in text           # as compile's (fresh-clone trial, session 55)
    data = json.loads(out.read_text())
    assert len(data["report"]["regions"]) == 3 and data["build"]["kernels"] == 3
    assert not (tmp_path / "cache").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["dry.json"]
    with pytest.raises(SystemExit) as e:              # without --dry-run, --out is required
        cli.main(["compile", "mlp", "--arch", "sm_80"])
    assert e.value.code == 2 and "--out" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:              # --json without --dry-run says so, --out or not
        cli.main(["compile", "mlp", "--arch", "sm_80", "--json", str(out)])
    assert e.value.code == 2 and "--json goes with --dry-run" in capsys.readouterr().err


@pytest.mark.parametrize("dynamic", [False, True])
def test_the_inputs_line_says_which_sizes_are_dynamic(dynamic, tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_NVCC", str(tmp_path / "no_nvcc"))
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    model, inputs = _model()
    dry = co.explain(model.eval(), inputs, arch="sm_90a", dynamic_batch=dynamic)
    (line,) = [ln for ln in str(dry).splitlines() if ln.startswith("inputs: ")]
    summary = dry.report.inputs
    (x,) = summary["inputs"]
    assert x["dtype"] == "float16" and x["shape"][1:] == [8, 8, 8]
    if dynamic:
        (sym,) = summary["dynamic"]
        assert x["shape"][0] == sym and summary["dynamic"][sym][0] == 2
        assert f"dynamic: 2 <= {sym}" in line
    else:
        assert x["shape"][0] == 4 and not summary["dynamic"]
        assert "every size static" in line
    # the JSON form carries it, and a report read back formats the same line
    assert Report(**json.loads(json.dumps(dry.report.to_dict()))).format().count(line) == 1


def test_a_batch_one_example_traced_at_batch_two_says_so(tmp_path, monkeypatch):
    """dynamic_batch with a batch-1 example traces a batch-2 copy (capture.py): the FLOPs
    and the inputs lines say so (fresh-user trial, session 55: "at the example inputs"
    counted batch 2)."""
    monkeypatch.setenv("CUTLASS_OFFLOAD_NVCC", str(tmp_path / "no_nvcc"))
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    m = nn.Sequential(nn.Linear(256, 512)).half()
    text = str(co.explain(m, (torch.randn(1, 64, 256, dtype=torch.float16),), arch="sm_80",
                          dynamic_batch=True))
    assert "33.6 MFLOP of matmul / conv / attention ops (at the traced inputs: batch 2)" in text
    assert "traced at batch 2 (the example's batch of 1 doubled" in text
    static = str(co.explain(m, (torch.randn(1, 64, 256, dtype=torch.float16),), arch="sm_80"))
    assert "16.8 MFLOP of matmul / conv / attention ops (at the example inputs)" in static
