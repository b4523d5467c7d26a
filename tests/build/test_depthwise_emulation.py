"""Build tier: the depthwise kernel's per-thread work (emit/templates/depthwise.cuh)
checked on the CPU: ``accumulate`` and ``finish`` (the row form) and the tiled form's
tile staging and ``accumulate_tile`` compiled by nvcc as host code and run for every
thread of the grid against a direct depthwise conv, on random geometries and every
epilogue form. Needs nvcc and the CUTLASS headers (CI has both),
no GPU; tests/gpu runs the real kernel."""
import subprocess
from pathlib import Path

import pytest

from cutlass_offload.build.toolchain import find_nvcc, include_dirs


pytestmark = pytest.mark.build

HERE = Path(__file__).parent
TEMPLATES = HERE.parents[1] / "src" / "cutlass_offload" / "emit" / "templates"


def test_depthwise_threads_match_a_direct_conv(tmp_path):
    nvcc = find_nvcc()
    exe = tmp_path / "emu"
    cmd = [str(nvcc), "-std=c++17", "-O1", "-arch=sm_90a", f'-DPRELUDE_HEADER="{TEMPLATES / "prelude.h"}"',
           f'-DACTIVATIONS_HEADER="{TEMPLATES / "activations.h"}"',
           f'-DDEPTHWISE_HEADER="{TEMPLATES / "depthwise.cuh"}"',
           f'-DDEPTHWISE_TILED_HEADER="{TEMPLATES / "depthwise_tiled.cuh"}"', "-o", str(exe),
           str(HERE / "depthwise_emulation.cu")]
    cmd += [f"-I{d}" for d in include_dirs()]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("fails 0"), run.stdout
