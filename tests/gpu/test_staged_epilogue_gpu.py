"""GPU: sm90a GEMMs with the staged elementwise epilogue (emit/staged.ENABLED,
emit/templates/staged_epilogue.h) against float32 on fresh random inputs, with the
allocator poisoned first, for fp16 and bf16: bias, GELU, a residual add with a post
ReLU, a SiLU times a residual, a plain GEMM; ragged M, N and K; the tile kinds whose
accumulator layouts and barriers differ (64- and 128-row ping-pong, a 256-row
cooperative tile, a 176-wide tile with a 2x1 cluster, a stream-K kernel). A learned
table names each GEMM's config, so the compile picks it. And convs, whose kernels
(implicit-GEMM TMA convs, emit/conv_sm90.py, or convs lowered onto the GEMM) take the
epilogue too: bias + SiLU, a residual add with a ReLU after it. Each in both store
forms (staged.STORE: 16-byte row stores, templates/staged_epilogue.h; TMA stores of
swizzled boxes, templates/staged_tma_epilogue.h)."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_fresh_outputs, gemm_table
from torch import nn

import cutlass_offload as co
from cutlass_offload.emit import conv_gemm_sm90, conv_sm90, gemm_sm90, staged
from cutlass_offload.ir import ConvKernel, GemmKernel
from cutlass_offload.select import sm90

pytestmark = pytest.mark.gpu

M, K = 300, 264              # rows and depth no tile divides
# name: (N, epilogue form, config)
LINEARS = {
    "bias_gelu_128pp": (200, "gelu", sm90._config((128, 128, 64), (1, 1, 1), sm90.PINGPONG)),
    "resadd_relu_256": (264, "resadd_relu", sm90._config((256, 128, 64), (1, 1, 1), sm90.COOP)),
    "plain_176": (360, "plain", sm90._config((128, 176, 64), (2, 1, 1), sm90.COOP)),
    "silu_mul_64pp": (96, "silu_mul", sm90._config((64, 128, 64), (1, 1, 1), sm90.PINGPONG)),
    "bias_stream_k": (136, "bias", sm90._config((128, 128, 64), (1, 1, 1), sm90.COOP, "stream_k")),
}


class Linears(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.ModuleDict({k: nn.Linear(K, n, bias=form in ("gelu", "resadd_relu", "bias"))
                                  for k, (n, form, _) in LINEARS.items()})
        # the residuals: (M, N) tensors computed from -x (each linear reads its own
        # multiple of x, so no two of them combine into one GEMM over their columns)
        self.res = nn.ModuleDict({k: nn.Linear(K, n, bias=False) for k, (n, form, _) in LINEARS.items()
                                  if form in ("resadd_relu", "silu_mul")})

    def forward(self, x):
        out = []
        r = {k: torch.tanh(m(-x)) for k, m in self.res.items()}
        for i, (k, (_, form, _)) in enumerate(LINEARS.items()):
            y = self.lin[k](x * (i + 1))
            if form == "gelu":
                y = F.gelu(y)
            elif form == "resadd_relu":
                y = F.relu(F.relu(y) + r[k])
            elif form == "silu_mul":
                y = F.silu(y) * r[k]
            out.append(y)
        return tuple(out)


@pytest.fixture
def table(tmp_path):
    with gemm_table(tmp_path / "staged_table.json", M, K, [(n, cfg) for n, _, cfg in LINEARS.values()]):
        yield


@pytest.mark.parametrize("store", ["rows", "tma"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_staged_epilogue_gemms_match_float32(store, table, tmp_path, dtype, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(staged, "ENABLED", True)
    monkeypatch.setattr(staged, "STORE", store)
    torch.manual_seed(0)
    model = Linears().to(device="cuda", dtype=dtype).eval()
    x = torch.randn(M, K, device="cuda", dtype=dtype)
    compiled = co.compile(model, (x,), arch="sm_90a", glue="eager")
    kernels = [k for k in compiled.plan.distinct_kernels if gemm_sm90.staged_epilogue_applies(k)]
    assert {k.config for k in kernels} >= {cfg for *_, cfg in LINEARS.values()}, compiled.report.format()
    tags = {k.epilogue.tag for k in kernels}
    assert {"bias_gelu", "bias_relu_resadd_relu", "plain", "silu_resmul", "bias"} <= tags, tags
    check_fresh_outputs(compiled, model, (M, K), dtype, list(LINEARS))
    assert sum(m.fallback_calls for m in compiled.region_modules()) == 0


def _staged(kernel) -> bool:
    """Whether ``kernel`` runs the staged epilogue (a GEMM, a TMA conv, a lowered conv's GEMM)."""
    if isinstance(kernel, GemmKernel):
        return gemm_sm90.staged_epilogue_applies(kernel)
    if isinstance(kernel, ConvKernel) and kernel.config.family == conv_sm90.FAMILY:
        if not kernel.iterator:
            return conv_sm90.staged_epilogue_applies(kernel)
        return gemm_sm90.staged_epilogue_applies(conv_gemm_sm90.gemm_kernel(kernel))
    return False


class Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(64, 64, 3, padding=1)
        self.c2 = nn.Conv2d(64, 96, 3, padding=1)
        self.c3 = nn.Conv2d(64, 96, 1)

    def forward(self, x):
        a = F.silu(self.c1(x))
        return a, F.relu(self.c2(a) + self.c3(-x))


@pytest.mark.parametrize("store", ["rows", "tma"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_staged_epilogue_convs_match_float32(store, tmp_path, dtype, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(staged, "ENABLED", True)
    monkeypatch.setattr(staged, "STORE", store)
    torch.manual_seed(0)
    model = Convs().to(device="cuda", dtype=dtype).eval()
    shape = (2, 64, 19, 21)              # output rows (2 * 19 * 21) no tile divides
    compiled = co.compile(model, (torch.randn(*shape, device="cuda", dtype=dtype),), arch="sm_90a", glue="eager")
    convs = [k for k in compiled.plan.distinct_kernels
             if isinstance(k, ConvKernel) and k.config.family == conv_sm90.FAMILY]     # 3.x or lowered
    assert convs and all(_staged(k) for k in convs), compiled.report.format()
    check_fresh_outputs(compiled, model, shape, dtype, ["silu", "residual_relu"])
    assert sum(m.fallback_calls for m in compiled.region_modules()) == 0
