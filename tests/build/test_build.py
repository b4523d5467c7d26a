"""Build tier: real CUTLASS code compiled with nvcc (no GPU needed)."""
import ctypes
import shutil
import subprocess

import pytest
import torch
import torch.nn as nn

import cutlass_offload as co
from cutlass_offload import emit
from cutlass_offload.errors import CompileError

pytestmark = pytest.mark.build


class Block(nn.Module):
    """Two GEMM regions sharing one kernel, and one with another epilogue."""

    def __init__(self, d=64):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = torch.relu(self.b(h))
        return self.c(h) + x


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
    src = (out / "kernels.cu").read_text()
    for k in compiled.plan.distinct_kernels:
        assert src.count(f"namespace {k.name} {{") == 1
    includes = [l for l in src.splitlines() if l.startswith("#include")]
    assert len(includes) == len(set(includes))


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


def test_second_compile_hits_the_cache(sm80_model):
    again = co.compile(Block().half(), _inputs(), arch="sm_80")
    assert again.report.build["cache_hit"] is True
    assert again.report.build["seconds"] == 0.0


def test_saved_folder_reloads(sm80_model):
    compiled, out = sm80_model
    loaded, reference, inputs = co.load(out)
    assert [r.name for r in loaded.plan.regions] == [r.name for r in compiled.plan.regions]
    with pytest.raises(co.DeviceError):       # no GPU here, or inputs on the CPU
        loaded(*inputs)


def test_nvcc_error_names_region_and_keeps_source(monkeypatch, tmp_path):
    from cutlass_offload.emit import gemm_sm80
    real = gemm_sm80.emit

    def broken(kernel):
        src = real(kernel)
        return type(src)(src.name, src.includes, src.code.replace("int run(", "int run(this is not C++ ", 1))
    monkeypatch.setitem(emit._EMITTERS, "cutlass2x_sm80", broken)
    out = tmp_path / "never"
    with pytest.raises(CompileError) as e:
        co.compile(nn.Sequential(nn.Linear(24, 40)).half(), (torch.randn(3, 24).half(),),
                   arch="sm_80", out_dir=out)
    err = e.value
    assert err.regions == ("region0_linear_bias",)
    assert len(err.kernels) == 1 and err.kernels[0].startswith("cutlass2x_sm80_gemm_f16")
    assert "this is not C++" in open(err.source_path).read()
    assert "error" in open(err.log_path).read()
    assert not out.exists()
    assert not list(tmp_path.iterdir())


def test_sm90a_kernel_compiles_to_wgmma(tmp_path):
    """One CUTLASS 3.x TMA warp-specialized kernel for sm_90a (about a minute on 2 cores)."""
    model = nn.Sequential(nn.Linear(128, 256), nn.GELU()).half()
    compiled = co.compile(model, (torch.randn(64, 128).half(),), arch="sm_90a")
    (k,) = compiled.plan.distinct_kernels
    assert k.config.family == "cutlass3x_sm90" and k.epilogue.tag == "bias_gelu"
    assert compiled.library_path.stat().st_size > 0
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:   # the device machine has it; CI and dev machines do not
        sass = subprocess.run([cuobjdump, "--dump-sass", str(compiled.library_path)],
                              capture_output=True, text=True, check=True).stdout
        assert "HGMMA" in sass, "the 3.x kernel does not use wgmma"
