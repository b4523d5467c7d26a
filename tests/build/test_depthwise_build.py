"""Build tier: depthwise convs (ConvNeXt's 7x7 with a bias, EfficientNet's strided
3x3 with a folded BatchNorm and SiLU) compile with nvcc into one sm_90a library
beside an ordinary conv (no GPU needed). The library exports each region's
launcher and workspace query (0 bytes: the kernel needs none)."""
import ctypes
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cutlass_offload as co
from cutlass_offload import emit
from cutlass_offload.runtime.library import CoConvArgs

pytestmark = pytest.mark.build


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.dw7 = nn.Conv2d(32, 32, 7, padding=3, groups=32)
        self.dw3 = nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=32, bias=False)
        self.bn = nn.BatchNorm2d(32)

    def forward(self, x):
        return F.silu(self.bn(self.dw3(self.dw7(x))))


def test_depthwise_kernels_build_into_one_library(tmp_path):
    out = tmp_path / "dw"
    x = torch.randn(2, 32, 16, 16, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    compiled = co.compile(Net().half().eval(), (x,), arch="sm_90a", out_dir=out)
    names = [k.name for k in compiled.plan.distinct_kernels]
    assert names == ["co_depthwise_conv2d_fprop_f16_nhwc_s7_sw1_q4_bias",
                     "co_depthwise_conv2d_fprop_f16_nhwc_s3_sw2_q2_bias_silu"], names
    assert not compiled.plan.fallbacks and not compiled.report.build["failures"]
    assert any(u["name"].startswith("shard_dw_conv_f16") for u in compiled.report.build["units"])
    lib = ctypes.CDLL(str(out / "libcutlass_offload.so"))
    lib.co_library_info.restype = ctypes.c_char_p
    assert json.loads(lib.co_library_info().decode())["kernels"] == names
    for r in compiled.plan.regions:
        getattr(lib, emit.region_symbol(r.name))
        ws = getattr(lib, emit.region_symbol(r.name) + emit.WORKSPACE_SUFFIX)
        ws.argtypes, ws.restype = [ctypes.POINTER(CoConvArgs)], ctypes.c_int64
        assert ws(ctypes.byref(CoConvArgs())) == 0


def test_a_measured_problem_builds_the_tiled_form(tmp_path):
    """ConvNeXt's first 7x7 (96 channels at 56 x 56) is in the measured table
    (families/depthwise_table.json): its kernel carries the tiled form, whose
    device code (cp.async tile staging) then compiles for sm_90a."""
    from cutlass_offload.families import depthwise
    dw = nn.Conv2d(96, 96, 7, padding=3, groups=96).half().eval()
    x = torch.randn(1, 96, 56, 56, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    compiled = co.compile(dw, (x,), arch="sm_90a", out_dir=tmp_path / "dw")
    (kernel,) = compiled.plan.distinct_kernels
    want = depthwise.tiled_for(compiled.plan.regions[0].problem, "sm90a")
    assert want and kernel.tiled == want and "_t{}x{}_".format(*want) in kernel.name
    assert not compiled.report.build["failures"]
