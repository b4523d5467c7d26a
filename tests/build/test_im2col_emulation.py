"""Build tier: the im2col pack kernel's index math (emit/templates/im2col.cuh) checked
on the CPU: the header compiled as host C++ (CUDA's qualifiers defined away, the grid
run thread by thread) against a direct im2col on 300 random conv geometries. Needs a
host C++ compiler (nvcc's; CI has one), no GPU; tests/gpu runs the real kernel."""
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.build

HERE = Path(__file__).parent
HEADER = HERE.parents[1] / "src" / "cutlass_offload" / "emit" / "templates" / "im2col.cuh"


def test_pack_matches_a_direct_im2col(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    exe = tmp_path / "emu"
    subprocess.run([cxx, "-std=c++17", "-O1", f'-DIM2COL_HEADER="{HEADER}"', "-o", str(exe),
                    str(HERE / "im2col_emulation.cpp")], check=True, capture_output=True, text=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("fails 0"), run.stdout
