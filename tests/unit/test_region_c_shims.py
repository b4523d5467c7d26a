"""The region ops' C shims (csrc/fast_call.cpp, ops.c_shims) without a GPU: Inductor's
C++ wrapper compiled for the CPU calls ``aoti_torch_cpu_region_<T>t_<I>i`` directly,
not the dispatcher; the shim hands each call to the C++ call path, here its Python
implementation (the regions run their PyTorch fallback, glue_helpers.regions_on_cpu);
the shim table keeps Inductor's FX-graph cache usable (an OpOverload does not pickle)."""
import copy
import pickle

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from cutlass_offload.runtime import fast_call, glue, ops
from glue_helpers import assert_close, five_kinds_inputs, offloaded, regions_on_cpu


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _shim_graph(dynamic_batch: bool, device: str = "cpu"):
    model = offloaded(dynamic_batch=dynamic_batch)
    og = glue.ops_graph(model.graph_module)
    arities = sorted({(e.n_tensors, e.n_ints) for e in og.entries})
    table = ops.c_shims(arities, device=device)
    assert table is not None, fast_call.error()
    return model, og, arities, table


def test_the_shim_table_pickles_as_names_and_comes_back_as_the_ops():
    fast_call.load(block=True)
    table = ops.c_shims([(2, 0), (3, 1), (99, 0)])
    assert table is not None, fast_call.error()
    assert set(table) == {ops.region_op(2, 0), ops.region_op(3, 1)}      # 99 tensors: no shim
    assert table[ops.region_op(3, 1)] == [
        "AOTITorchError aoti_torch_cuda_region_3t_1i(AtenTensorHandle t0, AtenTensorHandle t1, "
        "AtenTensorHandle t2, int64_t i0, int64_t key, AtenTensorHandle* ret0)"]
    blob = pickle.dumps(table)
    assert b"OpOverload" not in blob and pickle.dumps(ops.c_shims([(3, 1), (2, 0)])) == blob
    back = pickle.loads(blob)
    assert type(back) is ops.ShimTable and back == table
    assert copy.deepcopy(table) is table


def test_cpp_wrapper_calls_the_shims_and_matches_eager(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model, og, arities, table = _shim_graph(dynamic_batch=False)
    calls = regions_on_cpu(monkeypatch)
    x = five_kinds_inputs()
    fn = torch.compile(og.graph_module, backend="inductor",
                       options={"cpp_wrapper": True, glue.SHIM_OPTION: table})
    with torch.no_grad():
        out, code = run_and_get_code(fn, *x)
        ref = model.graph_module(*x)
    assert_close(out, ref)
    source = "\n".join(code)
    for nt, ni in arities:
        assert f"aoti_torch_cpu_region_{nt}t_{ni}i(" in source
    assert "aoti_torch_call_dispatcher" not in source and "proxy_executor" not in source
    assert len(calls) == 2 * len(og.entries)       # each region once through a shim, once eager
    assert counters["inductor"]["fxgraph_cache_bypass"] == 0
    # a second compile of the same graph is served by the FX-graph cache
    torch._dynamo.reset()
    fn = torch.compile(og.graph_module, backend="inductor",
                       options={"cpp_wrapper": True, glue.SHIM_OPTION: ops.c_shims(arities, device="cpu")})
    with torch.no_grad():
        assert_close(fn(*x), ref)
    assert counters["inductor"]["fxgraph_cache_hit"] == 1


class _Scale(torch.nn.Module):
    """A stand-in region module with an int input: x * n (n a size under dynamic shapes)."""
    fallback_calls = 0

    def forward(self, x, n):
        return x * n

    fallback = forward

    def output_strides(self, shape):
        return ops.contiguous_strides(shape)


class _Entry:
    module, cpp = _Scale(), False

    def inputs(self, tensors, ints):
        return [tensors[0], ints[0]]

    def strides(self, shape):
        return ops.contiguous_strides(shape)


def test_a_symbolic_size_reaches_the_shim_as_its_value(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    key = ops.key_id("test_region_c_shims/scale")
    real = ops.lookup
    monkeypatch.setattr(ops, "lookup", lambda k: _Entry() if k == key else real(k))
    table = ops.c_shims([(1, 1)], device="cpu")
    assert table is not None, fast_call.error()
    op = ops.region_op(1, 1)

    def f(x):
        return op(x.sin(), x.shape[0], key).cos()
    fn = torch.compile(f, backend="inductor", dynamic=True,
                       options={"cpp_wrapper": True, glue.SHIM_OPTION: table})
    x = torch.randn(3, 4)
    with torch.no_grad():
        out, code = run_and_get_code(fn, x)
    torch.testing.assert_close(out, (x.sin() * 3).cos())
    assert "aoti_torch_cpu_region_1t_1i(" in "\n".join(code)
    x = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), (x.sin() * 5).cos())
    assert counters["stats"]["unique_graphs"] == 1       # one symbolic compile served both


def test_compile_options_add_the_shims_only_for_a_cuda_cpp_wrapper(monkeypatch):
    fast_call.load(block=True)
    model = offloaded()
    ind = glue.InductorGlue(model.graph_module)
    monkeypatch.setattr(glue, "cpp_wrapper_in_default_mode", lambda: True)
    monkeypatch.delenv("CUTLASS_OFFLOAD_C_SHIMS", raising=False)
    assert list(ind.compile_options(True, [(2, 0)])[glue.SHIM_OPTION]) == [ops.region_op(2, 0)]  # on by default
    monkeypatch.setenv("CUTLASS_OFFLOAD_C_SHIMS", "0")          # the environment's choice
    assert glue.SHIM_OPTION not in ind.compile_options(True, [(2, 0)])
    monkeypatch.setenv("CUTLASS_OFFLOAD_C_SHIMS", "1")
    assert list(ind.compile_options(True, [(2, 0)])[glue.SHIM_OPTION]) == [ops.region_op(2, 0)]
    monkeypatch.setenv("CUTLASS_OFFLOAD_C_SHIMS", "maybe")
    with pytest.raises(ValueError, match="CUTLASS_OFFLOAD_C_SHIMS"):
        ind.compile_options(True, [(2, 0)])
    monkeypatch.delenv("CUTLASS_OFFLOAD_C_SHIMS")
    monkeypatch.setattr(glue, "REGION_C_SHIMS", False)
    assert glue.SHIM_OPTION not in ind.compile_options(True, [(2, 0)])
    monkeypatch.setattr(glue, "REGION_C_SHIMS", True)
    opts = ind.compile_options(True, [(2, 0)])
    assert list(opts[glue.SHIM_OPTION]) == [ops.region_op(2, 0)]
    assert glue.SHIM_OPTION not in ind.compile_options(False, [(2, 0)])
    assert glue.SHIM_OPTION not in glue.InductorGlue(model.graph_module, options={"cpp_wrapper": False}) \
        .compile_options(True, [(2, 0)])
    mine = glue.InductorGlue(model.graph_module, options={glue.SHIM_OPTION: {}})
    assert mine.compile_options(True, [(2, 0)])[glue.SHIM_OPTION] == {}      # the caller's choice
    monkeypatch.setattr(glue, "REGION_C_SHIMS", False)
    assert glue.SHIM_OPTION not in ind.compile_options(True, [(2, 0)])
    monkeypatch.setattr(glue, "REGION_C_SHIMS", True)
    ind.shims_failed = "undefined symbol"
    assert glue.SHIM_OPTION not in ind.compile_options(True, [(2, 0)])


def test_the_extension_exports_only_its_init_and_the_shims():
    """ops.c_shims makes the extension's symbols global: a library loaded after it must
    not bind to the inline c10 / ATen functions it instantiated (csrc/fast_call.map)."""
    import shutil
    import subprocess
    if shutil.which("nm") is None:
        pytest.skip("no nm")
    module = fast_call.load(block=True)
    assert module is not None, fast_call.error()
    out = subprocess.run(["nm", "-D", "--defined-only", module.__file__], capture_output=True,
                         text=True, check=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    shims = {n for n in names if n.startswith(("aoti_torch_cuda_region_", "aoti_torch_cpu_region_"))}
    assert names - shims == {"PyInit__co_fast_call"}
    assert len(shims) == 2 * 8 * 5 and "aoti_torch_cuda_region_8t_4i" in shims


class _RegionFailed(Exception):
    pass


def test_a_regions_exception_reaches_the_caller_through_its_shim(monkeypatch, tmp_path):
    """A shim returns only an error code, on which the C++ wrapper raises "API call
    failed at <file, line>"; the glue raises the region's own exception from it, once."""
    from cutlass_offload.runtime.region import RegionModule
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model, og, arities, table = _shim_graph(dynamic_batch=False)
    regions_on_cpu(monkeypatch)
    x = five_kinds_inputs()
    ind = glue.InductorGlue(model.graph_module, options={"cpp_wrapper": True, glue.SHIM_OPTION: table})
    with torch.no_grad():
        assert_close(ind(model.graph_module, *x), model.graph_module(*x))     # compiled, shims work

    def fail(self, *xs):
        raise _RegionFailed(f"{self.region.name}: a test failure")
    monkeypatch.setattr(RegionModule, "forward", fail)
    with pytest.raises(_RegionFailed, match="a test failure") as e:
        ind(model.graph_module, *x)
    assert isinstance(e.value.__cause__, RuntimeError) and "API call failed" in str(e.value.__cause__)
    assert fast_call.take_shim_error() is None                # taken by the glue
    assert ind.failed is None and ind.shims_failed is None    # a run-time error changes no option
