"""Build tier: grouped convs (CUTLASS 2.x grouped fprop, families/grouped_conv.py) in
both group modes compile with nvcc into one sm_90a library (no GPU needed), their
workspace queries run through the kernel's own problem size (groups compiled in),
and, on a machine without a GPU, CUTLASS's can_implement accepts the problems the
selection gave each kernel and refuses one that breaks its group mode (the call then
gets as far as the missing GPU)."""
import ctypes

import pytest
import torch
import torch.nn as nn

import cutlass_offload as co
from cutlass_offload import emit
from cutlass_offload.abi import CO_CANNOT_IMPLEMENT, CO_INIT_FAILED, CO_LAUNCH_FAILED
from cutlass_offload.runtime.library import CoConvArgs

pytestmark = pytest.mark.build


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.single = nn.Conv2d(128, 256, 3, padding=1, groups=4)     # C_g 32, K_g 64
        self.narrow = nn.Conv2d(72, 96, 3, padding=1, groups=3)       # C_g 24, K_g 32

    def forward(self, x, y):
        return torch.relu(self.single(x)), self.narrow(y)


def _args(problem, n, k=None, buf=None):
    a = CoConvArgs()
    a.n, a.h, a.w, a.c, a.k = n, problem.h, problem.w, problem.c, k or problem.k
    a.r, a.s, a.p, a.q = problem.r, problem.s, problem.p, problem.q
    a.pad_h, a.pad_w = problem.pad[0], problem.pad[2]
    a.stride_h, a.stride_w = problem.stride
    a.dilation_h, a.dilation_w = problem.dilation
    if buf is not None:               # 256-byte aligned host addresses, never dereferenced
        a.x = a.filter = a.y = a.bias = ctypes.addressof(buf) + (-ctypes.addressof(buf)) % 256
    return a


def test_grouped_kernels_build_and_cutlass_accepts_their_problems(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_GROUPED_CONV", "1")
    out = tmp_path / "grouped"
    h = torch.float16
    x = torch.randn(2, 128, 14, 14, dtype=h).contiguous(memory_format=torch.channels_last)
    y = torch.randn(2, 72, 14, 14, dtype=h).contiguous(memory_format=torch.channels_last)
    compiled = co.compile(Net().half().eval(), (x, y), arch="sm_90a", out_dir=out, glue="eager")
    assert not compiled.plan.fallbacks and not compiled.report.build["failures"]
    kinds = sorted((k.groups, k.iterator, k.config.tile[1]) for k in compiled.plan.kernels)
    assert [(g, it) for g, it, _ in kinds] == [(3, "analytic"), (4, "optimized")], kinds
    assert kinds[0][2] == 32, kinds            # K_g 32: a 32-wide tile
    lib = ctypes.CDLL(str(out / "libcutlass_offload.so"))
    buf = ctypes.create_string_buffer(1024)
    for r, kern in compiled.plan.pairs:
        run = getattr(lib, emit.region_symbol(r.name))
        ws = getattr(lib, emit.region_symbol(r.name) + emit.WORKSPACE_SUFFIX)
        ws.argtypes, ws.restype = [ctypes.POINTER(CoConvArgs)], ctypes.c_int64
        run.argtypes, run.restype = [ctypes.POINTER(CoConvArgs), ctypes.c_void_p], ctypes.c_int
        assert ws(ctypes.byref(_args(r.problem, 2, buf=buf))) == 0     # serial, no split-K
        if torch.cuda.is_available():
            continue                  # the calls below would launch on host addresses
        a = _args(r.problem, 2, buf=buf)
        a.workspace, a.workspace_bytes = None, 0
        assert run(ctypes.byref(a), None) in (CO_INIT_FAILED, CO_LAUNCH_FAILED), kern.name
        # K / groups that breaks the single-group mode: not a multiple of its tile's N
        tile_n = kern.config.tile[1]
        bad_k = kern.groups * (tile_n + tile_n // 2)
        bad = _args(r.problem, 2, k=bad_k, buf=buf)
        assert run(ctypes.byref(bad), None) == CO_CANNOT_IMPLEMENT, (kern.name, bad_k)
