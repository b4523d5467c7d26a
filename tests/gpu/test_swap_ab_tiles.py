"""GPU: swap_ab sm90a GEMMs (the kernel computes D^T = B^T A^T and stores it
column-major, i.e. D row-major: emit/gemm_sm90.py) run correctly: a bias (along D^T's
rows), a GELU, a plain output and a residual add, on tile Ns fitted to M in one tile
and in two, cooperative and ping-pong, with M, N and K all ragged, fp16 and bf16.

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

K = 264                      # not a multiple of the 64-deep K tile


def _configs(m):
    """(N, config) per linear for M rows: a tile N covering M, then half of it."""
    one, half = -(-m // 16) * 16, -(-m // 32) * 16
    return {
        "bias": (416, sm90._config((128, one, 64), (1, 1, 1), sm90.COOP, swap_ab=True)),
        "gelu": (328, sm90._config((64, one, 64), (1, 1, 1), sm90.PINGPONG, swap_ab=True)),
        "plain": (200, sm90._config((64, max(16, half), 64), (1, 1, 1), sm90.PINGPONG, swap_ab=True)),
    }


class Swapped(nn.Module):
    def __init__(self, configs):
        super().__init__()
        self.bias = nn.Linear(K, configs["bias"][0])
        self.gelu = nn.Linear(K, configs["gelu"][0])
        self.plain = nn.Linear(K, configs["plain"][0], bias=False)
        self.res = nn.Linear(K, configs["bias"][0])

    def forward(self, x):
        b = self.bias(x)
        return b, F.gelu(self.gelu(x)), self.plain(x), self.res(x) + b


@pytest.mark.parametrize("m", [154, 37])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_swapped_tiles_match_float32(m, dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    configs = _configs(m)
    with gemm_table(tmp_path / "swap_table.json", m, K, configs.values()):
        model = Swapped(configs).to(device="cuda", dtype=dtype).eval()
        x = torch.randn(m, K, device="cuda", dtype=dtype)
        compiled = co.compile(model, (x,), arch="sm_90a", combine_gemms=False)
    kernels = compiled.plan.distinct_kernels
    assert all(k.config.swap_ab for k in kernels), compiled.report.format()
    assert {k.config.tile for k in kernels} == {cfg.tile for _, cfg in configs.values()}
    assert any(k.epilogue.residual != "none" for k in kernels), compiled.report.format()
    assert not compiled.plan.fallbacks
    check_fresh_outputs(compiled, model, (m, K), dtype, ["bias", "gelu", "plain", "residual"])
    assert sum(mod.fallback_calls for mod in compiled.region_modules()) == 0
