"""Build tier: our GELU functor (emit/templates/activations.h, erfc by Numerical
Recipes' erfcc instead of erff) checked on the CPU against float64: the header
compiled as host C++ (the device path's rcp.approx / ex2.approx become 1 / v and
exp2f there; tests/gpu/test_numerics.py checks the device code inside real kernels).
Needs a host C++ compiler and nvcc's CUDA headers (CI has both), no GPU."""
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cutlass_offload.build.toolchain import cuda_include_dir
from cutlass_offload.cutlass_source import cutlass_root

pytestmark = pytest.mark.build

HERE = Path(__file__).parent
HEADER = HERE.parents[1] / "src" / "cutlass_offload" / "emit" / "templates" / "activations.h"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    cxx, nvcc = shutil.which("g++") or shutil.which("c++"), shutil.which("nvcc")
    cuda_inc = cuda_include_dir(nvcc) if nvcc else None
    if cxx is None or cuda_inc is None:
        pytest.skip("no host C++ compiler or CUDA headers")
    exe = tmp_path_factory.mktemp("act") / "emu"
    subprocess.run([cxx, "-std=c++17", "-O1", "-w", f'-DACTIVATIONS_HEADER="{HEADER}"',
                    "-I", str(cutlass_root() / "include"), "-I", cuda_inc, "-o", str(exe),
                    str(HERE / "activation_emulation.cpp")], check=True, capture_output=True, text=True)

    def run(x: np.ndarray) -> np.ndarray:
        d = exe.parent
        (d / "x.bin").write_bytes(x.astype(np.float32).tobytes())
        (d / "y.bin").write_bytes(np.full(x.size, np.nan, np.float32).tobytes())   # poisoned
        subprocess.run([str(exe), str(d / "x.bin"), str(d / "y.bin")], check=True, timeout=120)
        return np.frombuffer((d / "y.bin").read_bytes(), np.float32)
    return run


def _inputs():
    """Every finite fp16 and bf16 value, and a dense fp32 sample of [-12, 12]."""
    h = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
    vals = [h.view(torch.float16).float(), h.view(torch.bfloat16).float(),
            torch.linspace(-12, 12, 400_001), torch.randn(200_000, generator=torch.Generator().manual_seed(0)) * 4]
    x = torch.cat(vals)
    return x[torch.isfinite(x)].numpy()


def test_gelu_matches_float64_better_than_pytorchs_float32(emulator):
    x = _inputs()
    y = emulator(x).astype(np.float64)
    x64 = torch.from_numpy(x.astype(np.float64))
    ref = (0.5 * x64 * torch.erfc(-x64 * 0.7071067811865476)).numpy()   # no 1 + erf cancelling
    ours_abs = np.abs(y - ref)
    pt_abs = np.abs(F.gelu(torch.from_numpy(x)).double().numpy() - ref)
    big, small = np.abs(ref) > 1e-6, np.abs(x) <= 4
    assert np.isfinite(y).all()
    # documented in activations.h: < 2.5e-7 absolute for |x| <= 4 (beyond, a float32
    # ulp of the result is larger), 2.5e-6 relative where |gelu| > 1e-6
    assert ours_abs[small].max() < 2.5e-7, (x[small][ours_abs[small].argmax()], ours_abs[small].max())
    rel = ours_abs[big] / np.abs(ref[big])
    assert rel.max() < 2.5e-6, (x[big][rel.argmax()], rel.max())
    assert ours_abs[small].max() < pt_abs[small].max()    # PyTorch's float32 GELU: 1.2e-6
    # as fp16 / bf16 outputs: the correctly rounded result but at rounding ties' edges
    for dt in (torch.float16, torch.bfloat16):
        exact = torch.from_numpy(ref).float().to(dt)       # float64 -> float32 -> dt: at most
        ours = torch.from_numpy(y).float().to(dt)          # the same double rounding for both
        assert (ours != exact).double().mean() < 1e-3, dt


def test_gelu_special_values_follow_pytorch(emulator):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e30, -1e30, 100.0, -100.0, 3e38, -3e38], np.float32)
    y = emulator(x)
    # PyTorch's CUDA formula, 0.5 x (1 + erf(x / sqrt(2))) (its CPU kernel gives NaN for +inf)
    t = torch.from_numpy(x)
    ref = (0.5 * t * (1 + torch.erf(t * 0.7071067811865476))).numpy()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    fin = ~np.isnan(ref)
    np.testing.assert_array_equal(y[fin], ref[fin])
    np.testing.assert_array_equal(np.signbit(y[fin]), np.signbit(ref[fin]))
