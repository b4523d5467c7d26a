"""GPU: a gate and an up linear multiplied after an activation (SwiGLU / GEGLU) run as
one sm90a GEMM over their interleaved weights whose GLU epilogue writes only the
product (partition/gated_gemm.py, emit/templates/glu_epilogue.h), and so does one
projection split in halves (diffusers' GEGLU: ``up, gate = proj(x).chunk(2, -1)``): against float32 on
fresh random inputs, with the allocator poisoned first, for fp16 and bf16, under
eager and Inductor glue, with ragged M, N and K, biases, three activations and the
tile kinds whose accumulator layouts differ (a 64-row ping-pong tile, 128-row
cooperative ones on one and on two wgmma rows per warpgroup, a 176-wide tile on the
extended wgmma with a 2x1 cluster, a stream-K kernel), with the products stored from
registers, staged in shared memory (emit/glu_sm90.GLU_STAGED) and staged in TMA's
swizzled boxes, stored by TMA (GLU_TMA, templates/staged_tma_epilogue.h; the 176-wide
tile keeps the row store there).

A learned table naming a config per GLU GEMM shape (select/sm90.py ``use_table``)
makes the compile pick it."""

import pytest
import torch
import torch.nn.functional as F
from helpers import check_fresh_outputs, gemm_table
from torch import nn

import cutlass_offload as co
from cutlass_offload.emit import glu_sm90
from cutlass_offload.partition import gated_gemm
from cutlass_offload.select import sm90

pytestmark = pytest.mark.gpu

M, K = 300, 264              # rows and depth no tile divides
# name: (hidden N per projection, activation, bias ("none" / "gate" / "both"), config of the
# GEMM over 2N columns)
PAIRS = {
    "swiglu_176": (200, F.silu, "none", sm90._config((128, 176, 64), (2, 1, 1), sm90.COOP)),
    "geglu_pingpong": (96, lambda t: F.gelu(t, approximate="tanh"), "both",
                       sm90._config((64, 128, 64), (1, 1, 1), sm90.PINGPONG)),
    "gelu_256x128": (264, F.gelu, "gate", sm90._config((256, 128, 64), (1, 1, 1), sm90.COOP)),
    "swiglu_stream_k": (128, F.silu, "none",
                        sm90._config((128, 128, 64), (1, 1, 1), sm90.COOP, "stream_k")),
}
GEGLU_N, GEGLU_CONFIG = 320, sm90._config((128, 192, 64), (1, 1, 1), sm90.COOP)   # 640 columns: ragged


class Pairs(nn.Module):
    def __init__(self):
        super().__init__()
        self.gates = nn.ModuleDict({k: nn.Linear(K, n, bias=b != "none") for k, (n, _, b, _) in PAIRS.items()})
        self.ups = nn.ModuleDict({k: nn.Linear(K, n, bias=b == "both") for k, (n, _, b, _) in PAIRS.items()})
        self.geglu = nn.Linear(K, 2 * GEGLU_N)

    def forward(self, x):
        up, gate = self.geglu(x).chunk(2, dim=-1)
        return tuple(PAIRS[k][1](self.gates[k](x)) * self.ups[k](x) for k in PAIRS) + (up * F.gelu(gate),)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One kernel cache for the module: eager and Inductor glue share a dtype's kernels."""
    return tmp_path_factory.mktemp("glu_cache")


@pytest.fixture
def glu_table(tmp_path, monkeypatch):
    monkeypatch.setattr(gated_gemm, "MIN_K", 0)     # K = 264 here: the kernels at any K
    # the GEMMs over 2N interleaved columns
    pairs = [(2 * n, cfg) for n, _, _, cfg in PAIRS.values()] + [(2 * GEGLU_N, GEGLU_CONFIG)]
    with gemm_table(tmp_path / "glu_table.json", M, K, pairs):
        yield


@pytest.mark.parametrize("store", ["registers", "staged", "tma"])
@pytest.mark.parametrize("glue", ["eager", "inductor"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_glu_gemms_match_float32(glu_table, cache_dir, dtype, glue, store, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(cache_dir))
    monkeypatch.setattr(glu_sm90, "GLU_STAGED", store != "registers")
    monkeypatch.setattr(glu_sm90, "GLU_TMA", store == "tma")
    torch.manual_seed(0)
    model = Pairs().to(device="cuda", dtype=dtype).eval()
    x = torch.randn(M, K, device="cuda", dtype=dtype)
    compiled = co.compile(model, (x,), arch="sm_90a", glue=glue)
    glu = [k for k in compiled.plan.distinct_kernels if k.epilogue.glu]
    assert {k.config for k in glu} == {cfg for *_, cfg in PAIRS.values()} | {GEGLU_CONFIG}, \
        compiled.report.format()
    assert not compiled.plan.fallbacks
    check_fresh_outputs(compiled, model, (M, K), dtype, [*PAIRS, "geglu_chunk"])
    assert sum(m.fallback_calls for m in compiled.region_modules()) == 0
