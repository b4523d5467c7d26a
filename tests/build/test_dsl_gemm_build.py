"""Build tier, CuTe DSL (issue 21; skipped without the ``[dsl]`` extra): our Hopper
GEMM with fused epilogues (emit/dsl_gemm_sm90.py) compiles for sm_90a without a
GPU, exports an object file whose device code is an sm_90a cubin, and links with
the C ABI shim (CoGemmArgs -> the DSL's tensor structs) into a shared library."""
import ctypes
import subprocess

import pytest

from dsl_helpers import shim_library

from cutlass_offload.abi import WORKSPACE_SUFFIX
from cutlass_offload.build.dsl import symbol
from cutlass_offload.emit.dsl_gemm_sm90 import DslGemmConfig
from cutlass_offload.runtime.library import Library

pytestmark = pytest.mark.build
pytest.importorskip("cutlass.cute", reason="the CuTe DSL is not installed (pip install '.[dsl]')")

CONFIGS = [  # tile, cluster, dtype, activation, bias, residual, post relu[, gated]
    ((128, 128), (1, 1), "f16", "identity", False, "none", False),
    ((128, 256), (2, 1), "bf16", "gelu_erf", True, "add", False),
    ((64, 128), (1, 2), "f16", "silu", False, "mul", True),
    ((128, 256), (2, 1), "f16", "silu", False, "none", False, True),      # gated
]

EM_CUDA = 190  # ELF e_machine of NVIDIA device code


def _embedded_cubins(obj: bytes) -> list:
    """The ELF images of NVIDIA device code inside a host object file."""
    out, i = [], obj.find(b"\x7fELF", 1)
    while i != -1:
        if int.from_bytes(obj[i + 18:i + 20], "little") == EM_CUDA:
            out.append(obj[i:])
        i = obj.find(b"\x7fELF", i + 1)
    return out


def test_kernels_compile_without_a_gpu_export_and_link(tmp_path):
    lib = shim_library(tmp_path, CONFIGS)
    for c in CONFIGS:
        name = DslGemmConfig(*c).name
        assert _embedded_cubins((tmp_path / f"{name}.o").read_bytes()), f"{name}.o: no device code"
    # the DSL runtime's host functions are linked in, not left for the loader
    nm = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True)
    assert nm.returncode == 0 and " _cuda" not in nm.stdout and " _cuKernel" not in nm.stdout, nm.stdout
    info = Library(lib).info
    assert info == {"kind": "dsl_gemm", "kernels": [DslGemmConfig(*c).name for c in CONFIGS]}
    dll = ctypes.CDLL(str(lib))                  # loads; every entry point resolves
    for c in CONFIGS:
        sym = symbol(DslGemmConfig(*c))
        assert getattr(dll, sym) and getattr(dll, sym + WORKSPACE_SUFFIX)
