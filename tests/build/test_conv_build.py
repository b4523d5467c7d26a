"""Build tier: a conv2d model compiles into one library with nvcc (no GPU needed).

Kept to two 2.x kernels (sm_80 target): a residual-block conv and a C=3 stem conv
(alignment 1, the register-staged mainloop), so the tier stays fast on 2 cores.
"""
import ctypes

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cutlass_offload as co

pytestmark = pytest.mark.build


class Stem(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.a = nn.Conv2d(16, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        h = F.relu(self.stem(x))
        h = F.relu(self.a(h) + h)
        return F.relu(self.b(h) + h)


@pytest.fixture(scope="module")
def conv_model(tmp_path_factory, cache_dir):
    import os
    os.environ["CUTLASS_OFFLOAD_CACHE_DIR"] = str(cache_dir)
    out = tmp_path_factory.mktemp("out") / "stem"
    model = Stem().half().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    return co.compile(model, (x,), arch="sm_80", out_dir=out), out


def test_conv_regions_share_kernels_in_one_library(conv_model):
    compiled, out = conv_model
    assert [r.form for r in compiled.plan.regions] == ["conv2d"] * 3
    assert len(compiled.plan.distinct_kernels) == 2         # a and b share the residual kernel
    stem = compiled.plan.kernels[0]
    assert stem.align_a == 1 and stem.name != compiled.plan.kernels[1].name
    lib = ctypes.CDLL(str(out / "libcutlass_offload.so"))
    for r in compiled.plan.regions:
        assert getattr(lib, f"co_{r.name}") and getattr(lib, f"co_{r.name}_workspace")


def test_conv_report_and_reload(conv_model):
    compiled, out = conv_model
    text = compiled.report.format()
    assert "conv2d:bias_relu x1" in text and "conv2d:bias_resadd_relu x2" in text
    again, _, _ = co.load(out)
    assert [r.name for r in again.plan.regions] == [r.name for r in compiled.plan.regions]
