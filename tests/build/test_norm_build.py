"""Build tier: a model with a layer_norm and a written-out RMS norm compiles into one
library with nvcc (no GPU needed). Two small norm kernels (no GEMM), sm_80 target:
a few seconds per shard on 2 cores."""
import ctypes
import json

import pytest
import torch
import torch.nn as nn

import cutlass_offload as co
from cutlass_offload import emit
from norm_cases import GemmaRMSNorm, LayerNorm1P, LlamaRMSNorm

pytestmark = pytest.mark.build


class Norms(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.ln, self.rms = nn.LayerNorm(d, eps=1e-12), LlamaRMSNorm(d)

    def forward(self, x):
        return self.rms(self.ln(x) * 2.0)


def test_layer_norm_and_rms_norm_build_into_one_library(tmp_path):
    out = tmp_path / "norms"
    compiled = co.compile(Norms().half(), (torch.randn(2, 8, 64, dtype=torch.float16),),
                          arch="sm_80", out_dir=out, offload_norms="all")
    assert [r.problem.kind for r in compiled.plan.regions] == ["layer_norm", "rms_norm"]
    assert not compiled.plan.fallbacks and not compiled.report.build["failures"]
    assert sorted(k.name for k in compiled.plan.distinct_kernels) == [
        "rowwise_layer_norm_f16_vec8_weight_bias", "rowwise_rms_norm_f16_vec8_weight"]
    lib = ctypes.CDLL(str(out / "libcutlass_offload.so"))
    lib.co_library_info.restype = ctypes.c_char_p
    info = json.loads(lib.co_library_info().decode())
    assert info["arch"] == "sm80" and len(info["regions"]) == 2
    for r in compiled.plan.regions:
        getattr(lib, emit.region_symbol(r.name))
        getattr(lib, emit.region_symbol(r.name) + "_workspace")
    units = {u["name"] for u in compiled.report.build["units"]}
    assert any(n.startswith("shard_rowwise_layer_norm_f16") for n in units), units
    assert "regions offloaded" in compiled.report.format()


class OffsetNorms(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.ln, self.rms = LayerNorm1P(d), GemmaRMSNorm(d)

    def forward(self, x):
        return self.rms(self.ln(x) * 2.0)


def test_unit_offset_norms_build(tmp_path):
    """Gemma's RMSNorm and LayerNorm1P: the kernels scaling by 1 + weight compile."""
    compiled = co.compile(OffsetNorms().half(), (torch.randn(2, 8, 64, dtype=torch.float16),),
                          arch="sm_80", out_dir=tmp_path / "offset", offload_norms="all")
    assert not compiled.plan.fallbacks and not compiled.report.build["failures"]
    assert sorted(k.name for k in compiled.plan.distinct_kernels) == [
        "rowwise_layer_norm_f16_vec8_weight1p_bias", "rowwise_rms_norm_f16_vec8_weight1p"]
    assert (tmp_path / "offset" / "libcutlass_offload.so").exists()
