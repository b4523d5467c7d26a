"""Glue choices without a GPU: validation, "auto", the folder's saved choice and
load's override, the CLI flags, CUDA graphs that must not nest, the library
wrapper that refuses the launchers of regions whose kernel failed to build."""
import json
import subprocess
import sys

import pytest
import torch

import cutlass_offload as co
from cutlass_offload import cli
from cutlass_offload.runtime import glue
from cutlass_offload.api import GlueSpec
from cutlass_offload.errors import CutlassOffloadError
from cutlass_offload.runtime.compiled_model import LazyLibrary
from cutlass_offload.runtime.library import CO_CANNOT_IMPLEMENT
from glue_helpers import five_kinds_inputs, offloaded


class NoRegions(torch.nn.Module):
    def forward(self, x, y):
        return torch.sin(x) * 2 + y


def _inputs():
    return torch.randn(4, 8), torch.randn(4, 8)


@pytest.mark.parametrize("kw", [{"glue": "jit"}, {"mode": "fastest"}, {"options": {"no_such_knob": 1}},
                                {"glue": "eager", "mode": "reduce-overhead"},
                                {"glue": "eager", "options": {"max_autotune": True}}])
def test_bad_glue_arguments_fail_before_any_work(kw):
    with pytest.raises(ValueError):
        co.compile(NoRegions(), _inputs(), arch="sm_90a", **kw)


def test_auto_means_eager_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert glue.resolve_glue("auto") == "eager" and glue.resolve_glue(None) == "eager"
    assert glue.resolve_glue("inductor") == "inductor"
    m = co.compile(NoRegions(), _inputs(), arch="sm_90a")
    assert m.glue == "eager" and m.report.glue["requested"] == "auto"


def test_auto_means_inductor_with_gpu_and_triton(monkeypatch):
    monkeypatch.setattr(glue, "inductor_available", lambda: True)
    assert glue.resolve_glue("auto") == "inductor"


def test_mode_options_and_cuda_graphs():
    assert glue.mode_options("reduce-overhead", {"max-autotune": False}) == {
        "triton.cudagraphs": True, "max_autotune": False}
    assert glue.uses_cuda_graphs("max-autotune", None)
    assert not glue.uses_cuda_graphs(None, {"max_autotune": True})
    assert glue.uses_cuda_graphs("default", {"triton.cudagraphs": True})


def test_folder_keeps_the_glue_choice_and_load_overrides_it(tmp_path, monkeypatch):
    monkeypatch.setattr(glue, "inductor_available", lambda: False)
    out = tmp_path / "m"
    m = co.compile(NoRegions(), _inputs(), arch="sm_90a", out_dir=out, glue="inductor",
                   mode="reduce-overhead", options={"max_autotune": False})
    saved = json.loads((out / "manifest.json").read_text())["glue"]
    assert saved == {"glue": "inductor", "mode": "reduce-overhead", "options": {"max_autotune": False}}
    assert m.glue == "inductor" and m.inductor.cuda_graphs
    loaded, _, _ = co.load(out)
    assert loaded.glue == "inductor" and loaded.inductor.mode == "reduce-overhead"
    assert loaded.inductor.options == {"max_autotune": False}
    assert loaded.report.glue["requested"] == "inductor"
    loaded, _, _ = co.load(out, glue="eager")
    assert loaded.glue == "eager" and loaded.inductor is None
    loaded, _, _ = co.load(out, mode="default")            # mode only: the saved glue stays
    assert loaded.glue == "inductor" and loaded.inductor.mode == "default"
    with pytest.raises(ValueError):
        co.load(out, glue="eager", mode="reduce-overhead")


def test_folder_saved_before_glue_choices_loads_as_auto(tmp_path, monkeypatch):
    monkeypatch.setattr(glue, "inductor_available", lambda: False)
    out = tmp_path / "m"
    co.compile(NoRegions(), _inputs(), arch="sm_90a", out_dir=out, glue="eager")
    manifest = json.loads((out / "manifest.json").read_text())
    for key in ("glue", "files", "checksum", "format"):   # none of them existed then
        del manifest[key]
    (out / "manifest.json").write_text(json.dumps(manifest))
    loaded, _, _ = co.load(out)
    assert loaded.report.glue["requested"] == "auto" and loaded.glue == "eager"


def test_inductor_glue_runs_a_model_without_regions_on_cpu(tmp_path):
    torch._dynamo.reset()
    m = co.compile(NoRegions(), _inputs(), arch="sm_90a", glue="inductor")
    x, y = _inputs()
    torch.testing.assert_close(m(x, y), torch.sin(x) * 2 + y)
    assert m.inductor.first_call_s is not None and m.inductor.failed is None


def test_cuda_graphed_refuses_inductor_cuda_graphs():
    m = offloaded().set_glue("inductor", mode="reduce-overhead")
    with pytest.raises(CutlassOffloadError, match="CUDA graphs"):
        m.cuda_graphed()
    m.set_glue("inductor")
    m.cuda_graphed()                       # default mode: whole-model capture is allowed
    m.set_glue("eager")
    assert m.glue == "eager"


def test_auto_falls_back_to_eager_when_inductor_cannot_compile(monkeypatch):
    monkeypatch.setattr(glue, "inductor_available", lambda: True)
    m = offloaded().set_glue("auto")
    ran = []

    class BackendFailed(torch._dynamo.exc.TorchDynamoException):
        pass

    def broken(self, on_cuda=False):
        def fn(*a, **k):
            raise BackendFailed("no triton")
        return fn
    monkeypatch.setattr(glue.InductorGlue, "_compiled", broken)
    monkeypatch.setattr(type(m.graph_module), "__call__", lambda self, *a, **k: ran.append(1) or "eager")
    x = five_kinds_inputs()
    with pytest.warns(RuntimeWarning, match="eager glue"):
        assert m(*x) == "eager"
    assert m.glue == "eager" and "no triton" in m.inductor.failed and ran == [1]
    assert m(*x) == "eager" and ran == [1, 1]           # eager for good, no second try
    m2 = offloaded().set_glue("inductor")                # asked for explicitly: raised
    with pytest.raises(BackendFailed):
        m2(*x)


def test_cli_compile_saves_glue_flags(tmp_path, monkeypatch):
    (tmp_path / "glue_factory.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * 2\n"
        "def make():\n"
        "    return M(), (torch.randn(2, 4),)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "o"
    rc = cli.main(["compile", "glue_factory:make", "--out", str(out), "--arch", "sm_90a",
                   "--dtype", "fp32", "--glue", "inductor", "--mode", "reduce-overhead"])
    assert rc == 0
    saved = json.loads((out / "manifest.json").read_text())["glue"]
    assert saved["glue"] == "inductor" and saved["mode"] == "reduce-overhead"
    # report.json holds every phase the CLI prints: the model's construction first, the save last
    phases = json.loads((out / "report.json").read_text())["phases"]
    assert list(phases)[0] == "model" and list(phases)[-1] == "save" and "capture" in phases
    assert all(isinstance(v, float) and v >= 0 for v in phases.values())
    co.check_folder(out)                  # report.json written after the other files: still recorded
    assert cli.main(["compile", "glue_factory:make", "--out", str(out), "--arch", "sm_90a",
                     "--glue", "eager", "--mode", "reduce-overhead"]) == 2       # ValueError -> 2
    with pytest.raises(SystemExit):
        cli.main(["run", str(out), "--glue", "jit"])


def test_run_help_documents_glue():
    out = subprocess.run([sys.executable, "-m", "cutlass_offload.cli", "run", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--glue" in out and "--mode" in out and "saved by compile" in out


def _fake_library(tmp_path):
    src = tmp_path / "lib.c"
    src.write_text('const char* co_library_info(void) { return "{}"; }\n'
                   "int co_r0(void* a, void* s) { return 0; }\n"
                   "long long co_r0_workspace(void* a) { return 16; }\n")
    lib = tmp_path / "libfake.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    return lib


def test_pending_library_refuses_dropped_regions(tmp_path):
    from cutlass_offload.runtime.library import CoGemmArgs
    lib_path = _fake_library(tmp_path)
    waited = []
    lazy = LazyLibrary(lambda: waited.append(1) or (lib_path, ["r1"]))
    lib = lazy()
    assert lazy() is lib and waited == [1]           # resolved once
    run, ws = lib.launcher("co_r1", CoGemmArgs)
    assert run(None, None) == CO_CANNOT_IMPLEMENT and ws(None) == 0
    run, ws = lib.launcher("co_r0", CoGemmArgs)
    assert run(None, None) == 0 and ws(None) == 16
    assert lib.info == {}


def test_pending_library_raises_the_build_error():
    def failed():
        raise CutlassOffloadError("nvcc failed")
    lazy = LazyLibrary(failed)
    for _ in range(2):
        with pytest.raises(CutlassOffloadError, match="nvcc failed"):
            lazy()


def test_glue_spec_rejects_unsaveable_options():
    with pytest.raises(ValueError):
        GlueSpec("inductor", None, {"post_grad_custom_post_pass": object()}).to_json()


CPP = {"cpp_wrapper": True, "cpp_wrapper_build_separate": True,
       "aot_inductor.compile_wrapper_opt_level": "O0"}


def test_our_cpp_wrapper_is_compiled_at_o0(monkeypatch):
    """The wrapper we choose is built apart from kernels (min_optimize), at -O0; an
    option the caller set wins, and a torch without the option does not get it."""
    monkeypatch.delenv("CUTLASS_OFFLOAD_CPP_WRAPPER", raising=False)
    monkeypatch.setattr(glue, "CPP_WRAPPER_IN_DEFAULT_MODE", True)
    gm = torch.fx.symbolic_trace(NoRegions())
    assert "cpp_wrapper_build_separate" in glue._inductor_config_keys()
    mine = glue.InductorGlue(gm, options={"cpp_wrapper_build_separate": False})
    assert mine.compile_options(True) == {"cpp_wrapper": True, "cpp_wrapper_build_separate": False,
                                          "aot_inductor.compile_wrapper_opt_level": "O0"}
    mine = glue.InductorGlue(gm, options={"aot_inductor.compile_wrapper_opt_level": "O2"})
    assert mine.compile_options(True)["aot_inductor.compile_wrapper_opt_level"] == "O2"
    monkeypatch.setattr(glue, "_inductor_config_keys", lambda: {"cpp_wrapper"})
    assert glue.InductorGlue(gm).compile_options(True) == {"cpp_wrapper": True}


def test_cpp_wrapper_default_follows_the_environment(monkeypatch):
    gm = torch.fx.symbolic_trace(NoRegions())
    monkeypatch.setattr(glue, "CPP_WRAPPER_IN_DEFAULT_MODE", False)
    monkeypatch.setenv("CUTLASS_OFFLOAD_CPP_WRAPPER", "1")
    assert glue.InductorGlue(gm).compile_options(on_cuda=True) == CPP
    monkeypatch.setattr(glue, "CPP_WRAPPER_IN_DEFAULT_MODE", True)
    monkeypatch.setenv("CUTLASS_OFFLOAD_CPP_WRAPPER", "0")
    assert glue.InductorGlue(gm).compile_options(on_cuda=True) == {}
    monkeypatch.setenv("CUTLASS_OFFLOAD_CPP_WRAPPER", "")       # empty: the module's default
    assert glue.InductorGlue(gm).compile_options(on_cuda=True) == CPP
    for off in ("off", "False", "no"):                            # read as PROGRESS reads them
        monkeypatch.setenv("CUTLASS_OFFLOAD_CPP_WRAPPER", off)
        assert glue.InductorGlue(gm).compile_options(on_cuda=True) == {}


def test_default_mode_glue_on_cuda_uses_the_cpp_wrapper(monkeypatch):
    monkeypatch.delenv("CUTLASS_OFFLOAD_CPP_WRAPPER", raising=False)
    gm = torch.fx.symbolic_trace(NoRegions())
    monkeypatch.setattr(glue, "CPP_WRAPPER_IN_DEFAULT_MODE", False)
    assert glue.InductorGlue(gm).compile_options(on_cuda=True) == {}
    monkeypatch.setattr(glue, "CPP_WRAPPER_IN_DEFAULT_MODE", True)
    plain = glue.InductorGlue(gm)
    assert plain.compile_options(on_cuda=True) == CPP
    assert plain.compile_options(on_cuda=False) == {}          # CPU glue: Inductor's own default
    assert glue.InductorGlue(gm, mode="default").compile_options(True) == CPP
    # the caller's choice wins; CUDA graphs (reduce-overhead) keep Inductor's default
    assert glue.InductorGlue(gm, options={"cpp_wrapper": False}).compile_options(True) == {"cpp_wrapper": False}
    assert glue.InductorGlue(gm, mode="reduce-overhead").compile_options(True) == {}
    assert glue.InductorGlue(gm, options={"triton.cudagraphs": True}).compile_options(True) == {
        "triton.cudagraphs": True}


def test_cpu_glue_is_compiled_without_the_cpp_wrapper(monkeypatch):
    monkeypatch.delenv("CUTLASS_OFFLOAD_CPP_WRAPPER", raising=False)
    monkeypatch.setattr(glue, "CPP_WRAPPER_IN_DEFAULT_MODE", True)
    seen = {}
    real = torch.compile

    def spy(model, **kw):
        seen.update(kw)
        return real(model, **kw)
    monkeypatch.setattr(torch, "compile", spy)
    gm = torch.fx.symbolic_trace(NoRegions())
    g = glue.InductorGlue(gm)
    x, y = _inputs()
    torch.testing.assert_close(g(gm, x, y), NoRegions()(x, y))
    assert seen["options"] is None and g.used_options == {}
