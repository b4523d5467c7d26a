"""GPU: N-split cooperative sm90a GEMMs (the two consumer warp groups side by side
along N, 192-row tiles: emit/gemm_sm90.py N_SPLIT_TEMPLATE) run correctly: a bias,
a GELU, a plain output and a residual add read through the tile-wide epilogue
subtile, on 192x192 (96-wide wgmmas), 192x160 (80-wide, CuTe's extended shapes)
and 192x128 tiles, clusters 1x1 and 2x1, with ragged M, N and K, fp16 and bf16.

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

M, K = 500, 264              # 3 rows of 192-row tiles, the last ragged; K not a multiple of 64
N_SPLIT = {                  # (N, config) per linear; the residual's linear shares "bias"'s shape
    "bias": (416, sm90._config((192, 192, 64), (1, 1, 1), sm90.COOP, n_split=True)),
    "gelu": (320, sm90._config((192, 160, 64), (1, 1, 1), sm90.COOP, n_split=True)),
    "plain": (200, sm90._config((192, 128, 64), (2, 1, 1), sm90.COOP, n_split=True)),
}
OUTPUTS = ["bias", "gelu", "plain", "residual"]


class NSplit(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Linear(K, N_SPLIT["bias"][0])
        self.gelu = nn.Linear(K, N_SPLIT["gelu"][0])
        self.plain = nn.Linear(K, N_SPLIT["plain"][0], bias=False)
        self.res = nn.Linear(K, N_SPLIT["bias"][0])

    def forward(self, x):
        b = self.bias(x)
        return b, F.gelu(self.gelu(x)), self.plain(x), self.res(x) + b


@pytest.fixture
def n_split_table(tmp_path):
    with gemm_table(tmp_path / "n_split_table.json", M, K, N_SPLIT.values()):
        yield


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_n_split_tiles_match_float32(n_split_table, dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    model = NSplit().to(device="cuda", dtype=dtype).eval()
    x = torch.randn(M, K, device="cuda", dtype=dtype)
    compiled = co.compile(model, (x,), arch="sm_90a", combine_gemms=False)
    kernels = compiled.plan.distinct_kernels
    assert all(k.config.n_split for k in kernels), compiled.report.format()
    assert {k.config.tile[:2] for k in kernels} == {cfg.tile[:2] for _, cfg in N_SPLIT.values()}
    assert any(k.epilogue.residual != "none" for k in kernels), compiled.report.format()
    assert not compiled.plan.fallbacks
    check_fresh_outputs(compiled, model, (M, K), dtype, OUTPUTS)
    assert sum(m.fallback_calls for m in compiled.region_modules()) == 0
