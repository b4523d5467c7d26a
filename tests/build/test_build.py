"""Build tier: real CUTLASS code compiled with nvcc (no GPU needed)."""
import ctypes
import shutil
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cutlass_offload as co
from cutlass_offload import emit
from cutlass_offload.errors import CompileError

pytestmark = pytest.mark.build


class Block(nn.Module):
    """Two GEMM regions sharing one kernel, and one with another epilogue (an
    activation of ours, emit/templates/activations.h, before a residual)."""

    def __init__(self, d=64):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = torch.relu(self.b(h))
        return F.hardsigmoid(self.c(h)) + x


def _inputs(d=64):
    return (torch.randn(2, 8, d, dtype=torch.float16),)


@pytest.fixture(scope="session")
def sm80_model(tmp_path_factory, cache_dir):
    import os
    os.environ["CUTLASS_OFFLOAD_CACHE_DIR"] = str(cache_dir)
    out = tmp_path_factory.mktemp("out") / "block"
    model = Block().half()
    return co.compile(model, _inputs(), arch="sm_80", out_dir=out), out


def test_one_library_kernels_shared(sm80_model):
    compiled, out = sm80_model
    assert len(compiled.plan.regions) == 3
    assert len(compiled.plan.distinct_kernels) == 2     # a and b share their kernel
    sources = [p.read_text() for p in (out / "src").glob("shard_*.cu")]
    for k in compiled.plan.distinct_kernels:            # each kernel compiled once
        assert sum(src.count(f"namespace {k.name} {{") for src in sources) == 2  # decl + body
    for src in sources:
        includes = [l for l in src.splitlines() if l.startswith("#include")]
        assert len(includes) == len(set(includes))
    launchers = next((out / "src").glob("launchers.*.cu")).read_text()
    assert "#include <cutlass" not in launchers          # launchers never parse CUTLASS


def test_library_loads_and_exports_every_region(sm80_model):
    compiled, out = sm80_model
    lib = ctypes.CDLL(str(out / "libcutlass_offload.so"))
    lib.co_library_info.restype = ctypes.c_char_p
    import json
    info = json.loads(lib.co_library_info().decode())
    assert info["arch"] == "sm80"
    assert sorted(info["kernels"]) == sorted(k.name for k in compiled.plan.distinct_kernels)
    for r in compiled.plan.regions:
        getattr(lib, emit.region_symbol(r.name))
        getattr(lib, emit.region_symbol(r.name) + "_workspace")


def test_library_exports_the_c_abi_only(sm80_model):
    """Nothing but co_* is exported: CUTLASS's template statics (2.x kernels keep
    thread_local device_ordinal_ / sm_occupancy_, STB_GNU_UNIQUE when exported) would
    otherwise be merged across libraries, and a second library with the same 2.x
    kernel skip raising its shared memory limit and fail to launch."""
    compiled, out = sm80_model
    text = subprocess.run(["readelf", "--dyn-syms", "-W", str(out / "libcutlass_offload.so")],
                          capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in text.splitlines()]
    rows = [r for r in rows if len(r) >= 8 and r[0].endswith(":") and r[0][:-1].isdigit()]
    defined = [r for r in rows if r[6] != "UND" and r[4] != "LOCAL"]
    names = {row[7] for row in defined}
    assert names and all(n.startswith("co_") for n in names), sorted(names)[:5]
    assert not [row for row in defined if row[4] == "UNIQUE"]
    assert {emit.region_symbol(r.name) for r in compiled.plan.regions} <= names


def test_second_compile_hits_the_cache(sm80_model):
    again = co.compile(Block().half(), _inputs(), arch="sm_80")
    assert again.report.build["cache_hit"] is True
    assert not [u for u in again.report.build["units"] if not u["cache_hit"]]


def test_saved_folder_reloads(sm80_model):
    compiled, out = sm80_model
    loaded, reference, inputs = co.load(out)
    assert [r.name for r in loaded.plan.regions] == [r.name for r in compiled.plan.regions]
    with pytest.raises(co.DeviceError):       # no GPU here, or inputs on the CPU
        loaded(*inputs)


class Siblings(nn.Module):
    """Two linears on one input with nothing fused: one combined GEMM region."""

    def __init__(self, d=64):
        super().__init__()
        self.a, self.b = nn.Linear(d, 32), nn.Linear(d, 48, bias=False)

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x)], dim=-1)


def test_a_folder_with_combined_linears_reloads_the_same_plan(tmp_path):
    out = tmp_path / "siblings"
    compiled = co.compile(Siblings().half(), _inputs(), arch="sm_80", out_dir=out)
    (gemm,) = compiled.plan.regions
    assert gemm.problem.n == 80 and any("combines" in n for n in gemm.notes)
    loaded, _, _ = co.load(out)        # re-captures and partitions again: the same plan
    assert [(r.name, r.problem.n, r.notes) for r in loaded.plan.regions] == \
        [(r.name, r.problem.n, r.notes) for r in compiled.plan.regions]


def test_nvcc_error_names_region_and_keeps_source(monkeypatch, tmp_path):
    from cutlass_offload.emit import gemm_sm80
    real = gemm_sm80.emit

    def broken(kernel):
        src = real(kernel)
        return type(src)(src.name, src.includes, src.code.replace("int run(", "int run(this is not C++ ", 1))
    monkeypatch.setattr(gemm_sm80, "emit", broken)
    out = tmp_path / "never"
    with pytest.raises(CompileError) as e:
        co.compile(nn.Sequential(nn.Linear(24, 40)).half(), (torch.randn(3, 24).half(),),
                   arch="sm_80", out_dir=out, build_strategy="single")
    err = e.value
    assert err.regions == ("region0_linear_bias",)
    assert len(err.kernels) == 1 and err.kernels[0].startswith("cutlass2x_sm80_gemm_f16")
    assert "this is not C++" in open(err.source_path).read()
    assert "error" in open(err.log_path).read()
    assert not out.exists()
    assert not list(tmp_path.iterdir())


class QuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class TransposedLinear(nn.Module):
    """A Linear on a transposed view: A is M-contiguous (the VAE's attention input)."""

    def __init__(self, k=128, n=256):
        super().__init__()
        self.lin, self.act = nn.Linear(k, n), QuickGELU()

    def forward(self, x):
        return self.act(self.lin(x.t()))


def compile_sm90a():
    """The sm_90a compile of test_sm90a_kernel_compiles_to_wgmma (also run ahead:
    build_ahead.py)."""
    return co.compile(TransposedLinear().half(), (torch.randn(128, 64).half(),), arch="sm_90a")


def test_sm90a_kernel_compiles_to_wgmma(build_ahead):
    """One CUTLASS 3.x TMA warp-specialized kernel for sm_90a (about a minute on 2
    cores), reading a column-major A (TMA + wgmma, MN-major), its EVT applying one
    of our activations (emit/templates/activations.h)."""
    build_ahead.wait("sm90a_wgmma")
    compiled = compile_sm90a()
    (k,) = compiled.plan.distinct_kernels
    assert k.config.family == "cutlass3x_sm90" and k.epilogue.tag == "bias_qgelu"
    assert k.layout_a == "col" and "_nn_" in k.name
    assert compiled.library_path.stat().st_size > 0
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:   # the device machine has it; CI and dev machines do not
        sass = subprocess.run([cuobjdump, "--dump-sass", str(compiled.library_path)],
                              capture_output=True, text=True, check=True).stdout
        assert "HGMMA" in sass, "the 3.x kernel does not use wgmma"


def test_sm80_column_major_a_compiles(tmp_path):
    """The 2.x kernel of a Linear on a transposed view: A ColumnMajor."""
    compiled = co.compile(TransposedLinear(64, 32).half(), (torch.randn(64, 16).half(),), arch="sm_80")
    (k,) = compiled.plan.distinct_kernels
    assert k.config.family == "cutlass2x_sm80" and k.layout_a == "col"
    assert compiled.library_path.stat().st_size > 0


def _exports(lib_path):
    lib = ctypes.CDLL(str(lib_path))
    lib.co_library_info.restype = ctypes.c_char_p
    nm = shutil.which("nm")
    syms = None
    if nm:
        text = subprocess.run([nm, "-D", "--defined-only", str(lib_path)], capture_output=True,
                              text=True, check=True).stdout
        syms = sorted(l.split()[-1] for l in text.splitlines() if l.split()[-1].startswith("co_"))
    return lib.co_library_info().decode(), syms


def test_strategies_build_the_same_library(sm80_model):
    compiled, _ = sm80_model
    expected = _exports(compiled.library_path)
    for strategy in ("single", "per-region"):
        other = co.compile(Block().half(), _inputs(), arch="sm_80", build_strategy=strategy)
        assert other.report.build["strategy"] == strategy
        assert _exports(other.library_path) == expected, strategy


def test_changed_layer_recompiles_one_shard(sm80_model):
    model = Block().half()
    model.c = nn.Linear(64, 36).half()          # N=36: alignment 4, a new kernel
    model.forward = lambda x: model.c(torch.relu(model.b(torch.relu(model.a(x)))))
    compiled = co.compile(model, _inputs(), arch="sm_80")
    built = [u for u in compiled.report.build["units"] if not u["cache_hit"]]
    assert [len(u["kernels"]) for u in built if u["name"] != "launchers"] == [1]


def test_failing_kernel_falls_back_alone_and_is_cached(monkeypatch):
    from cutlass_offload.emit import gemm_sm80
    real = gemm_sm80.emit

    def sometimes_broken(kernel):
        src = real(kernel)
        if kernel.epilogue.activation == "silu":
            return type(src)(src.name, src.includes, src.code + "\nstatic_assert(false, \"planted\");\n")
        return src
    monkeypatch.setattr(gemm_sm80, "emit", sometimes_broken)

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.p, self.q = nn.Linear(32, 32), nn.Linear(32, 32)

        def forward(self, x):
            return torch.nn.functional.silu(self.p(x)), torch.sigmoid(self.q(x))
    model, x = Two().half(), (torch.randn(4, 32).half(),)
    compiled = co.compile(model, x, arch="sm_80", build_strategy="sharded")
    assert [r.problem.epilogue.activation for r in compiled.plan.regions] == ["sigmoid"]
    (fb,) = compiled.plan.fallbacks
    assert "failed to compile" in fb.reason and fb.op == "linear"
    (failure,) = compiled.report.build["failures"]
    assert "planted" in open(failure["log"]).read()
    again = co.compile(model, x, arch="sm_80", build_strategy="sharded")   # cached failure
    assert not [u for u in again.report.build["units"] if not u["cache_hit"]]
    assert len(again.plan.fallbacks) == 1
    with pytest.raises(co.CutlassOffloadError, match="strict"):
        co.compile(model, x, arch="sm_80", strict=True)


def _compile_in_subprocess(cache_dir):
    import os
    os.environ["CUTLASS_OFFLOAD_CACHE_DIR"] = cache_dir
    model = nn.Sequential(nn.Linear(48, 48), nn.ReLU()).half()
    c = co.compile(model, (torch.randn(5, 48).half(),), arch="sm_80")
    return str(c.library_path), c.report.build["cache_hit"]


def test_two_processes_build_into_one_cache(tmp_path):
    import multiprocessing as mp
    with mp.get_context("spawn").Pool(2) as pool:
        results = pool.map(_compile_in_subprocess, [str(tmp_path)] * 2)
    assert results[0][0] == results[1][0]          # the same published library
    meta = list((tmp_path / "obj").glob("shard_*/meta.json"))
    assert len(meta) == 1                           # compiled once: the other waited on the lock
    assert not list((tmp_path / "obj").glob(".staging-*"))


def _compile_forever(cache_dir):
    import os
    os.environ["CUTLASS_OFFLOAD_CACHE_DIR"] = cache_dir
    co.compile(nn.Sequential(nn.Linear(40, 40), nn.SiLU()).half(), (torch.randn(6, 40).half(),),
               arch="sm_80")


def test_killed_build_leaves_the_cache_usable(tmp_path):
    import multiprocessing as mp
    import os
    import signal
    import time
    proc = mp.get_context("spawn").Process(target=_compile_forever, args=(str(tmp_path),))
    proc.start()
    deadline = time.time() + 120
    while time.time() < deadline and not list((tmp_path / "obj").glob(".staging-*/unit.cu")):
        time.sleep(0.2)
    time.sleep(1.0)                                  # nvcc is running now
    os.kill(proc.pid, signal.SIGKILL)                # the nvcc it started is orphaned
    proc.join()
    assert not list((tmp_path / "obj").glob("shard_*/meta.json"))   # nothing half-published
    _compile_forever(str(tmp_path))                  # the next build just works
    assert len(list((tmp_path / "obj").glob("shard_*/meta.json"))) == 1


def _load_in_subprocess(out):
    loaded, _, _ = co.load(out)
    return [r.name for r in loaded.plan.regions]


def test_one_process_compiles_while_another_loads(sm80_model, tmp_path):
    import multiprocessing as mp
    compiled, out = sm80_model
    with mp.get_context("spawn").Pool(2) as pool:
        building = pool.apply_async(_compile_in_subprocess, (str(tmp_path),))
        loading = pool.apply_async(_load_in_subprocess, (str(out),))
        assert loading.get(timeout=600) == [r.name for r in compiled.plan.regions]
        assert building.get(timeout=600)[0].endswith("libcutlass_offload.so")


def _save_again(out, times):
    for _ in range(times):
        co.compile(Block().half(), _inputs(), arch="sm_80", out_dir=out)   # cached kernels
    return times


def _load_while(out, stop):
    import os
    regions, loads = set(), 0
    while loads == 0 or not os.path.exists(stop):
        loaded, _, _ = co.load(out)
        regions.add(tuple(r.name for r in loaded.plan.regions))
        loads += 1
    return loads, regions


def test_loading_a_folder_while_it_is_saved_again(sm80_model, tmp_path):
    """One process writes the same output folder again and again (save swaps it in
    atomically) while another loads it in a loop: every load gets a complete,
    consistent folder."""
    import multiprocessing as mp
    compiled, out = sm80_model
    stop = tmp_path / "stop"
    with mp.get_context("spawn").Pool(2) as pool:
        loading = pool.apply_async(_load_while, (str(out), str(stop)))
        assert pool.apply_async(_save_again, (str(out), 3)).get(timeout=600) == 3
        stop.touch()
        loads, regions = loading.get(timeout=600)
    assert loads >= 1 and regions == {tuple(r.name for r in compiled.plan.regions)}
    assert not list(out.parent.glob(f".{out.name}.*"))        # no temporary folder left behind


def test_a_cached_rebuild_names_its_sources_as_a_cold_one(sm80_model, tmp_path):
    """Units reused from the cache are reported under their shard's name, so the
    output folder's src/ holds the same file names (one key each) as a cold build's."""
    _, out = sm80_model
    again = tmp_path / "again"
    co.compile(Block().half(), _inputs(), arch="sm_80", out_dir=again)
    names = sorted(p.name for p in (again / "src").glob("*.cu"))
    assert names == sorted(p.name for p in (out / "src").glob("*.cu"))
    assert all(n.count(".") == 2 for n in names), names       # <unit>.<key>.cu
