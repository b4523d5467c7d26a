"""Build tier: a model with two GroupNorm -> SiLU blocks (one kernel, two regions)
compiles into one sm_80 library with nvcc (no GPU needed; one small shard, about
ten seconds on 2 cores). The library's workspace-size entry point runs on the host,
so the launch plan's arithmetic is checked here too."""
import ctypes
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cutlass_offload as co
from cutlass_offload import emit
from cutlass_offload.runtime.library import CoGroupNormArgs

pytestmark = pytest.mark.build


class Blocks(nn.Module):
    def __init__(self, c=64):
        super().__init__()
        self.gn1, self.gn2 = nn.GroupNorm(32, c), nn.GroupNorm(32, c, eps=1e-6)

    def forward(self, x):
        return F.silu(self.gn2(F.silu(self.gn1(x)) * 2.0))


def test_group_norm_silu_builds_one_kernel_for_two_regions(tmp_path):
    out = tmp_path / "gn"
    x = torch.randn(2, 64, 8, 8, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    compiled = co.compile(Blocks().half(), (x,), arch="sm_80", out_dir=out)
    assert [r.form for r in compiled.plan.regions] == ["group_norm", "group_norm"]
    assert [r.problem.eps for r in compiled.plan.regions] == [1e-5, 1e-6]
    assert not compiled.plan.fallbacks and not compiled.report.build["failures"]
    assert [k.name for k in compiled.plan.distinct_kernels] == ["nhwc_group_norm_f16_vec2_weight_bias_silu"]
    units = {u["name"] for u in compiled.report.build["units"]}
    assert any(n.startswith("shard_nhwc_group_norm_f16") for n in units), units

    lib = ctypes.CDLL(str(out / "libcutlass_offload.so"))
    lib.co_library_info.restype = ctypes.c_char_p
    info = json.loads(lib.co_library_info().decode())
    assert info["arch"] == "sm80" and len(info["regions"]) == 2
    sym = emit.region_symbol(compiled.plan.regions[0].name)
    getattr(lib, sym)
    ws = getattr(lib, sym + "_workspace")
    ws.argtypes, ws.restype = [ctypes.POINTER(CoGroupNormArgs)], ctypes.c_int64

    def workspace(n, c, h, w, groups):
        a = CoGroupNormArgs()
        a.n, a.c, a.h, a.w, a.groups, a.eps = n, c, h, w, groups, 1e-5
        return ws(ctypes.byref(a))
    # no GPU here: the plan assumes 132 SMs, about 2 blocks per SM. SD's first norm
    # (2, 320, 64, 64) takes three launches: 160 vector columns x 3 lanes per block,
    # 128 tiles of 32 pixels per image: (mean, rstd) per (n, group) + (count, mean,
    # M2) per tile
    assert workspace(2, 320, 64, 64, 32) == 2 * 32 * 8 + 2 * 32 * 128 * 12
    # a batch of 300 fills the GPU with one tile per image: (mean, rstd) only
    assert workspace(300, 320, 64, 64, 32) == 300 * 32 * 8
    # small enough for one block per (n, group chunk) to hold in registers: one
    # launch, no workspace (SD's 320 channels at 32x32, the odd 12 x 7x5)
    assert workspace(2, 320, 32, 32, 32) == 0 and workspace(2, 12, 7, 5, 3) == 0
    # cannot implement (C not a multiple of groups, odd channels per group): 0
    assert workspace(2, 12, 8, 8, 5) == 0 and workspace(2, 15, 8, 8, 5) == 0
