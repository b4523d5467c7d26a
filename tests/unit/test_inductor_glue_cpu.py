"""Inductor glue without a GPU: the offloaded graph with its regions as custom-op
calls, compiled by Inductor for the CPU, regions running their PyTorch fallback
(glue_helpers.regions_on_cpu); the torch.compile backend's AOT path; the library
build beside the glue compile."""
import threading

import pytest
import torch
from torch._dynamo.utils import counters

import cutlass_offload as co
from cutlass_offload import api
from cutlass_offload.runtime import glue
from cutlass_offload.runtime import ops
from glue_helpers import FiveKinds, assert_close, five_kinds_inputs, offloaded, regions_on_cpu


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def test_ops_graph_replaces_every_region_and_keeps_the_rest(monkeypatch):
    model = offloaded()
    og = glue.ops_graph(model.graph_module)
    nodes = list(og.graph_module.graph.nodes)
    op_nodes = [n for n in nodes if str(n.target).startswith("cutlass_offload.region_")]
    assert len(op_nodes) == len(model.plan.regions)
    assert not any(n.op == "call_module" for n in nodes)
    assert {e.module.region.name for e in og.entries} == {r.name for r in model.plan.regions}
    for n, e in zip(op_nodes, og.entries):
        assert n.target is ops.region_op(e.n_tensors, e.n_ints) and n.args[-1] == e.id
        assert len(n.args) == e.n_tensors + e.n_ints + 1
    assert og.inlined == []
    calls = regions_on_cpu(monkeypatch)
    x = five_kinds_inputs()
    with torch.no_grad():
        assert_close(og.graph_module(*x), model.graph_module(*x))
    assert len(calls) == 2 * len(model.plan.regions)      # eager graph + op graph


def test_ops_graph_inlines_a_region_the_op_cannot_express(monkeypatch):
    model = offloaded()
    gm = model.graph_module
    first = next(gm.get_submodule(n.target).region.name for n in gm.graph.nodes if n.op == "call_module"
                 and hasattr(gm.get_submodule(n.target), "region"))
    real = ops.input_kinds
    seen = []

    def kinds(values):
        seen.append(1)
        return None if len(seen) == 1 else real(values)      # the first region: "a float input"
    monkeypatch.setattr(ops, "input_kinds", kinds)
    og = glue.ops_graph(model.graph_module)
    assert og.inlined == [first]
    assert len(og.entries) == len(model.plan.regions) - 1
    regions_on_cpu(monkeypatch)
    x = five_kinds_inputs()
    with torch.no_grad():
        assert_close(og.graph_module(*x), model.graph_module(*x))


def test_inductor_glue_calls_regions_and_keeps_a_dynamic_batch(monkeypatch):
    torch.manual_seed(0)
    eager = FiveKinds().eval()
    model = offloaded(eager, five_kinds_inputs(3), dynamic_batch=True)
    calls = regions_on_cpu(monkeypatch)
    model.set_glue("inductor")
    assert model.glue == "inductor" and model.inductor.cuda_graphs is False
    g0 = _graphs()
    for batch, seed in ((3, 1), (5, 2), (3, 3)):
        x = five_kinds_inputs(batch, seed)
        n = len(calls)
        out = model(*x)
        with torch.no_grad():
            assert_close(out, eager(*x))
        assert len(calls) - n == len(model.plan.regions)     # each region ran once, through the op
    assert _graphs() - g0 == 1           # compiled once, dynamic in the batch from the first call
    assert model.inductor.first_call_s is not None
    assert not out[0].requires_grad      # run under no_grad


def test_cpp_wrapper_glue_calls_regions_through_the_dispatcher(monkeypatch):
    """Inductor's C++ wrapper (what default-mode CUDA glue may use) calls each region
    op from C++ through the dispatcher (aoti_torch_call_dispatcher), never back
    through Python (custom_op_wrapper), and the result is the model's, with a
    dynamic batch."""
    from torch._inductor.utils import run_and_get_code
    torch.manual_seed(0)
    eager = FiveKinds().eval()
    model = offloaded(eager, five_kinds_inputs(3), dynamic_batch=True)
    calls = regions_on_cpu(monkeypatch)
    og = glue.ops_graph(model.graph_module)
    fn = torch.compile(og.graph_module, backend="inductor", options={"cpp_wrapper": True},
                       dynamic=True)
    with torch.no_grad():
        out, code = run_and_get_code(fn, *five_kinds_inputs(3, 1))
        assert_close(out, eager(*five_kinds_inputs(3, 1)))
        n = len(calls)
        assert_close(fn(*five_kinds_inputs(5, 2)), eager(*five_kinds_inputs(5, 2)))
    assert len(calls) - n == len(model.plan.regions)
    source = "\n".join(code)
    assert source.count("aoti_torch_call_dispatcher(\"cutlass_offload::region_") == len(model.plan.regions)
    assert "custom_op_wrapper" not in source


def test_a_failing_cpp_wrapper_we_chose_falls_back_to_the_python_wrapper(monkeypatch):
    """When the C++ wrapper that default-mode CUDA glue gets by default cannot be
    compiled (say, no working host compiler), the glue is compiled again with
    Inductor's Python wrapper, with a warning, instead of falling back to eager
    glue; a C++ wrapper the caller asked for fails as before."""
    from torch._inductor import codecache
    torch.manual_seed(0)
    eager = FiveKinds().eval()
    model = offloaded(eager, five_kinds_inputs(3))
    calls = regions_on_cpu(monkeypatch)
    real_options = glue.InductorGlue.compile_options
    monkeypatch.setattr(glue.InductorGlue, "compile_options",
                        lambda self, on_cuda, arities=(): real_options(self, True, arities))  # "CUDA" glue
    monkeypatch.setattr(glue, "CPP_WRAPPER_IN_DEFAULT_MODE", True)
    monkeypatch.setattr(glue, "REGION_C_SHIMS", True)
    monkeypatch.delenv("CUTLASS_OFFLOAD_CPP_WRAPPER", raising=False)

    def broken(*a, **k):
        raise RuntimeError("C++ compile error: test")
    monkeypatch.setattr(codecache.CppWrapperCodeCache, "load_pybinding", broken)
    model.set_glue("inductor")
    x = five_kinds_inputs(3, 1)
    with pytest.warns(RuntimeWarning, match="C\\+\\+ wrapper could not compile the glue .*Python wrapper"):
        out = model(*x)
    with torch.no_grad():
        assert_close(out, eager(*x))
    g = model.inductor
    assert g.failed is None and "C++ compile error: test" in g.cpp_wrapper_failed
    assert "C++ compile error: test" in g.shims_failed       # tried without the C shims first
    assert g.used_options == {} and g.first_call_s is not None
    n = len(calls)
    model(*x)
    assert len(calls) - n == len(model.plan.regions)      # through the op, compiled glue
    asked = glue.InductorGlue(model.graph_module, options={"cpp_wrapper": True},
                              fallback_to_eager=True)
    with pytest.warns(RuntimeWarning, match="the model runs with eager glue"):
        asked(model.graph_module, *x)
    assert asked.failed and asked.cpp_wrapper_failed is None


def test_automatic_dynamic_glue_specializes_first_then_recompiles_once(monkeypatch):
    torch.manual_seed(0)
    eager = FiveKinds().eval()
    model = offloaded(eager, five_kinds_inputs(3), dynamic_batch=True)
    calls = regions_on_cpu(monkeypatch)
    model.set_glue("inductor", dynamic="auto")
    counts = []
    for batch, seed in ((3, 1), (5, 2), (7, 3), (3, 4)):
        g0, x = _graphs(), five_kinds_inputs(batch, seed)
        n = len(calls)
        out = model(*x)
        with torch.no_grad():
            assert_close(out, eager(*x))
        assert len(calls) - n == len(model.plan.regions)
        counts.append(_graphs() - g0)
    # static first compile; the second size recompiles with a symbolic batch, which
    # then serves every later size
    assert counts == [1, 1, 0, 0]
    with pytest.raises(ValueError, match="dynamic"):
        model.set_glue("inductor", dynamic="always")


def test_static_model_rejects_another_shape_before_inductor(monkeypatch):
    model = offloaded()
    regions_on_cpu(monkeypatch)
    model.set_glue("inductor")
    model(*five_kinds_inputs(2))
    with pytest.raises(Exception, match="2|dim|size|shape"):
        model(*five_kinds_inputs(3))


def test_glue_is_compiled_again_after_the_model_moves(monkeypatch):
    model = offloaded()
    regions_on_cpu(monkeypatch)
    model.set_glue("inductor")
    x = five_kinds_inputs()
    model(*x)
    fn = model.inductor._state[0]
    model.to(torch.float32)                         # _apply: tensors may be new objects
    assert model.inductor._state is None
    model(*x)
    assert model.inductor._state[0] is not fn


class _FakeBuild:
    """api._PendingBuild stand-in: 'builds' in a thread that only finishes once the
    glue compile has started (so a compile that waited for the build would hang);
    reports ``dropped`` regions as failed."""
    instances = []

    def __init__(self, plan, options, dropped=()):
        self.plan, self.dropped = plan, list(dropped)
        self.compile_started = threading.Event()
        self.done = threading.Event()
        self.seconds = 0.0
        self.failed = None
        _FakeBuild.instances.append(self)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        ok = self.compile_started.wait(timeout=300)
        self.ok = ok
        self.done.set()

    def result(self):
        assert self.done.wait(timeout=600)
        from cutlass_offload.build.result import BuildResult
        from dataclasses import replace
        kept = tuple((r, k) for r, k in zip(self.plan.regions, self.plan.kernels) if r.name not in self.dropped)
        plan = replace(self.plan, regions=tuple(r for r, _ in kept), kernels=tuple(k for _, k in kept))
        return BuildResult(library=None, plan=plan, strategy="sharded", seconds=0.0, jobs=1)

    def library(self):
        self.result()
        return None, self.dropped


class _InstantBuild(_FakeBuild):
    def _run(self):
        self.ok = True
        self.done.set()


def test_library_builds_beside_the_glue_compile(monkeypatch):
    _FakeBuild.instances.clear()
    calls = regions_on_cpu(monkeypatch)
    dropped = []
    monkeypatch.setattr(api, "_PendingBuild", lambda plan, options: _FakeBuild(plan, options, dropped))
    monkeypatch.setattr(api, "_warm_inputs", lambda inputs, options, spec: tuple(inputs))
    real_compiled = glue.InductorGlue._compiled

    def compiled(self, on_cuda=False):
        _FakeBuild.instances[-1].compile_started.set()     # the build is still running here
        return real_compiled(self, on_cuda)
    monkeypatch.setattr(glue.InductorGlue, "_compiled", compiled)
    eager = FiveKinds().eval()
    x = five_kinds_inputs()
    dropped.append("region4_linear_bias")
    model = co.compile(eager, x, arch="sm_90a", allow_tf32=True, glue="inductor", offload_norms="all")
    build = _FakeBuild.instances[-1]
    assert build.ok                      # it finished because the glue compile had started
    assert len(calls) == len(build.plan.regions)           # the warm-up call ran every region
    assert "region4_linear_bias" not in {r.name for r in model.plan.regions}
    disabled = {m.region.name: m.disabled for m in model.region_modules() if m.disabled}
    assert list(disabled) == ["region4_linear_bias"]
    assert model.report.glue["glue"] == "inductor"
    assert "glue: compile + first call" in model.report.phases
    # CPU glue: Inductor's own default, the Python wrapper (the C++ one is for CUDA glue)
    assert "compiled during the first call with Inductor's Python wrapper" in model.report.glue["note"]
    with torch.no_grad():
        assert_close(model(*five_kinds_inputs(2, 5)), eager(*five_kinds_inputs(2, 5)))


def test_backend_offloads_aot_forms_and_restores_the_rest(monkeypatch):
    """Under torch.compile the partitioner sees AOTAutograd's graph: addmm,
    native_layer_norm, the SDPA backend op and native_group_norm. An attention
    it cannot offload (head dim 6) goes back to AOTAutograd's op."""
    calls = regions_on_cpu(monkeypatch)
    monkeypatch.setattr(api, "_PendingBuild", _InstantBuild)

    class WithOdd(FiveKinds):
        def forward(self, x, img):
            y, z = super().forward(x, img)
            q = x[:, :, :12].reshape(x.shape[0], 16, 2, 6).transpose(1, 2)
            return y + torch.nn.functional.scaled_dot_product_attention(q, q, q).mean(1).sum(-1, keepdim=True), z

    torch.manual_seed(0)
    eager = WithOdd().eval()
    be = co.make_backend(arch="sm_90a", allow_tf32=True, glue="inductor")
    fast = torch.compile(eager, backend=be)
    with torch.no_grad():
        for batch, seed in ((2, 1), (4, 2)):
            x = five_kinds_inputs(batch, seed)
            assert_close(fast(*x), eager(*x))
    compiled = be.compiled[0]
    forms = sorted(r.form for r in compiled.plan.regions)
    # the layer norm is Inductor's (offload_norms "auto" with Inductor glue)
    assert forms == ["addmm", "addmm", "conv2d", "group_norm", "sdpa", "sdpa"]
    reasons = [f.reason for f in compiled.plan.fallbacks]
    assert any("head" in r for r in reasons), reasons
    assert [f.op for f in compiled.plan.fallbacks if "offload_norms='group'" in f.reason] == ["layer_norm"]
    g = compiled.report.glue
    assert g["restored"] == 1 and sum(g["composite_forms"].values()) == 4
    assert len(calls) >= 2 * 6


def test_the_backend_without_a_gpu_says_how_to_give_it_the_target(monkeypatch):
    """torch.compile(backend=...) has no --arch: the advice names make_backend (a
    fresh-user trial, session 53, was told to pass --arch)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    try:
        with pytest.raises(Exception, match=r"make_backend\(arch='sm_90a'\)") as info:
            torch.compile(torch.nn.Linear(8, 8), backend=co.make_backend())(torch.randn(2, 8))
        assert "--arch" not in str(info.value)
    finally:
        torch._dynamo.reset()
