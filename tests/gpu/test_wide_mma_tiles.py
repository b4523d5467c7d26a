"""GPU: sm90a GEMM tiles whose N is outside CuTe's default wgmma shapes (the
wave-fitted 128x176 of llama's MLP, 64x80, 128x160) run correctly: compiled with
a wgmma as wide as the tile (emit/sm90_parts.wgmma_selector) and, for N an odd
multiple of 16, one tile-wide epilogue
subtile (emit/sm90_parts.py), including a fused residual multiply that reads C
through that subtile, ragged M and N edges, and fp16 and bf16.

A learned table naming those configs for the model's shapes (select/sm90.py
``use_table``) makes the compile pick them; each output is checked against a
float32 reference on fresh random inputs, with the allocator poisoned first."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_fresh_outputs, gemm_table
from torch import nn

import cutlass_offload as co
from cutlass_offload.select import sm90

pytestmark = pytest.mark.gpu

M, K = 300, 264              # rows and depth that no tile divides
SWIGLU_N = 400               # 2 x 176 + 48: a ragged last 176-wide tile
WIDE = {                     # (N, config) per linear
    "swiglu": (SWIGLU_N, sm90._config((128, 176, 64), (2, 1, 1), sm90.COOP)),
    "gelu": (352, sm90._config((128, 176, 64), (1, 1, 1), sm90.COOP)),
    "plain": (240, sm90._config((64, 80, 64), (1, 1, 1), sm90.PINGPONG)),
    "bias": (320, sm90._config((128, 160, 64), (1, 1, 1), sm90.COOP)),
}


class WideTiles(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(K, SWIGLU_N, bias=False)
        self.up = nn.Linear(K, SWIGLU_N, bias=False)
        self.gelu = nn.Linear(K, WIDE["gelu"][0])
        self.plain = nn.Linear(K, WIDE["plain"][0], bias=False)
        self.bias = nn.Linear(K, WIDE["bias"][0])

    def forward(self, x):
        return (F.silu(self.gate(x)) * self.up(x), F.gelu(self.gelu(x)), self.plain(x),
                self.bias(x))


@pytest.fixture
def wide_table(tmp_path):
    with gemm_table(tmp_path / "wide_table.json", M, K, WIDE.values()):
        yield


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_wide_mma_tiles_match_float32(wide_table, dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    model = WideTiles().to(device="cuda", dtype=dtype).eval()
    x = torch.randn(M, K, device="cuda", dtype=dtype)
    compiled = co.compile(model, (x,), arch="sm_90a", combine_gemms=False)
    tiles = {k.config.tile[:2] for k in compiled.plan.distinct_kernels}
    assert tiles == {cfg.tile[:2] for _, cfg in WIDE.values()}, compiled.report.format()
    assert not compiled.plan.fallbacks
    check_fresh_outputs(compiled, model, (M, K), dtype, list(WIDE))
    assert sum(m.fallback_calls for m in compiled.region_modules()) == 0
