"""Build tier: a conv with a fused per-sample (N, K, 1, 1) add (the UNet's time
embedding; CUTLASS_OFFLOAD_PER_SAMPLE_ADD=1) compiles with nvcc for sm_90a, its
custom EVT node (emit/templates/per_sample_broadcast.h) included (no GPU needed;
about 30 s on 2 cores), and a saved folder keeps the option: its load partitions the
program again into the same fused region whatever the environment says."""
import ctypes

import pytest
import torch
import torch.nn as nn

import cutlass_offload as co
from cutlass_offload import emit
from cutlass_offload.abi import CO_CANNOT_IMPLEMENT
from cutlass_offload.runtime.library import CoConvArgs

pytestmark = pytest.mark.build


class TimeEmbeddingConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(32, 64, 3, padding=1)

    def forward(self, x, temb):
        return self.conv(x) + temb[:, :, None, None]


def compile_time_embedding(out_dir=None):
    """The model compiled for sm_90a with CUTLASS_OFFLOAD_PER_SAMPLE_ADD=1 (also run
    ahead: build_ahead.py)."""
    x = torch.randn(2, 32, 10, 12, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    temb = torch.randn(2, 64, dtype=torch.float16)
    with pytest.MonkeyPatch.context() as m:
        m.setenv("CUTLASS_OFFLOAD_PER_SAMPLE_ADD", "1")
        return co.compile(TimeEmbeddingConv().half().eval(), (x, temb), arch="sm_90a",
                          out_dir=out_dir, glue="eager")


def test_per_sample_add_builds_and_reloads(tmp_path, monkeypatch, build_ahead):
    build_ahead.wait("per_sample")
    out = tmp_path / "temb"
    compiled = compile_time_embedding(out)
    assert not compiled.plan.fallbacks and not compiled.report.build["failures"]
    (r, kern), = compiled.plan.pairs
    assert kern.epilogue.residual_per_sample and kern.iterator == "", kern.name
    assert "conv2d:bias_ressvecadd x1" in compiled.report.format()

    lib = ctypes.CDLL(str(out / "libcutlass_offload.so"))
    run = getattr(lib, emit.region_symbol(r.name))
    ws = getattr(lib, emit.region_symbol(r.name) + emit.WORKSPACE_SUFFIX)
    ws.argtypes, ws.restype = [ctypes.POINTER(CoConvArgs)], ctypes.c_int64
    run.argtypes, run.restype = [ctypes.POINTER(CoConvArgs), ctypes.c_void_p], ctypes.c_int
    buf = ctypes.create_string_buffer(1024)
    a = CoConvArgs()
    p = r.problem
    a.n, a.h, a.w, a.c, a.k, a.r, a.s, a.p, a.q = 2, p.h, p.w, p.c, p.k, p.r, p.s, p.p, p.q
    a.pad_h, a.pad_w = p.pad[0], p.pad[2]
    a.stride_h, a.stride_w = p.stride
    a.dilation_h, a.dilation_w = p.dilation
    a.x = a.filter = a.y = a.bias = ctypes.addressof(buf) + (-ctypes.addressof(buf)) % 256
    assert ws(ctypes.byref(a)) == 0
    a.residual = None                          # the per-sample vector is required
    assert run(ctypes.byref(a), None) == CO_CANNOT_IMPLEMENT

    monkeypatch.setenv("CUTLASS_OFFLOAD_PER_SAMPLE_ADD", "0")
    again, _, _ = co.load(out)
    assert [g.name for g in again.plan.regions] == [r.name]
