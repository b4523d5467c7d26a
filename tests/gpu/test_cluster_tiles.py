"""GPU: sm90a GEMMs in clusters of 4 and 8 CTAs (TMA multicast of A and B panels:
select/sm90.py ``multicast_configs``) run correctly now that their persistent grid is
sized from the clusters the device holds (emit/templates/cluster_occupancy.h), not
from CUTLASS's estimate: 128x128 and 128x64 cooperative tiles in 2x4, 4x2 and 2x2
clusters, 64-row ping-pong tiles in 4x1 and a swap_ab 128x80 tile in 2x4, with a
plain output, a bias, a GELU and a residual add, a long K (1280) and M ragged against the tile grid (500 rows: the
cluster's last row of tiles half empty), fp16 and bf16.

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

M, K = 500, 1280
CLUSTERED = {                # (N, config) per linear; the residual's linear shares "bias"'s shape
    "plain": (3840, sm90._config((128, 128, 64), (2, 4, 1), sm90.COOP)),
    "bias": (1280, sm90._config((128, 64, 64), (4, 2, 1), sm90.COOP)),
    "gelu": (768, sm90._config((64, 128, 64), (4, 1, 1), sm90.PINGPONG)),
    "wide": (2560, sm90._config((128, 128, 64), (2, 2, 1), sm90.COOP)),
    # swap_ab (D^T = B^T A^T): 128 along N, 80 along M (7 tiles of 80 rows: the last
    # cluster of 4 along M has one CTA without a tile)
    "swap": (1536, sm90._config((128, 80, 64), (2, 4, 1), sm90.COOP, swap_ab=True)),
}
OUTPUTS = ["plain", "bias", "gelu", "wide", "swap", "residual"]


class Clustered(nn.Module):
    def __init__(self):
        super().__init__()
        self.plain = nn.Linear(K, CLUSTERED["plain"][0], bias=False)
        self.bias = nn.Linear(K, CLUSTERED["bias"][0])
        self.gelu = nn.Linear(K, CLUSTERED["gelu"][0])
        self.wide = nn.Linear(K, CLUSTERED["wide"][0])
        self.swap = nn.Linear(K, CLUSTERED["swap"][0])
        self.res = nn.Linear(K, CLUSTERED["bias"][0])

    def forward(self, x):
        b = self.bias(x)
        return self.plain(x), b, F.gelu(self.gelu(x)), self.wide(x), self.swap(x), self.res(x) + b


@pytest.fixture
def cluster_table(tmp_path):
    with gemm_table(tmp_path / "cluster_table.json", M, K, CLUSTERED.values()):
        yield


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_clustered_tiles_match_float32(cluster_table, dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    model = Clustered().to(device="cuda", dtype=dtype).eval()
    x = torch.randn(M, K, device="cuda", dtype=dtype)
    compiled = co.compile(model, (x,), arch="sm_90a", combine_gemms=False)
    kernels = compiled.plan.distinct_kernels
    assert {k.config.cluster for k in kernels} == {cfg.cluster for _, cfg in CLUSTERED.values()}, \
        compiled.report.format()
    assert any(k.epilogue.residual != "none" for k in kernels), compiled.report.format()
    assert any(k.config.swap_ab for k in kernels), compiled.report.format()
    assert not compiled.plan.fallbacks
    check_fresh_outputs(compiled, model, (M, K), dtype, OUTPUTS)
    assert sum(m.fallback_calls for m in compiled.region_modules()) == 0
