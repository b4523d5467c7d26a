"""GPU: activations written out as several ops (x * sigmoid(x), the erf GELU,
hardswish via relu6) become the epilogue's activation (partition/activation_forms.py)
and run inside the GEMM / conv kernels; fresh inputs, outputs poisoned, against
float32."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cutlass_offload as co
from helpers import check_fresh_outputs

pytestmark = pytest.mark.gpu


class Written(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(64, 256), nn.Linear(256, 128, bias=False), nn.Linear(128, 64)
        self.conv = nn.Conv2d(16, 32, 3, padding=1)

    def forward(self, x, img):
        h = self.a(x)
        h = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))        # BERT-era GELU
        h = self.b(h)
        h = h * torch.sigmoid(h)                                      # swish
        h = self.c(h)
        h = h * F.relu6(h + 3.0) / 6.0                                # hardswish
        y = self.conv(img)
        return h, y * torch.sigmoid(y)


def _inputs(seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(4, 50, 64, generator=g, device="cuda").to(dtype)
    img = torch.randn(2, 16, 12, 12, generator=g, device="cuda").to(dtype)
    return x, img.contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_written_activations_run_in_the_epilogues(dtype):
    torch.manual_seed(0)
    model = Written().to(dtype).cuda().eval().to(memory_format=torch.channels_last)
    m = co.compile(model, _inputs(0, dtype), arch="sm_90a")
    acts = sorted(r.problem.epilogue.activation for r in m.plan.regions)
    assert acts == ["gelu_erf", "hardswish", "silu", "silu"], m.report.format()
    check_fresh_outputs(m, model, lambda r: _inputs(r + 1, dtype), dtype, ["h", "conv"])
    calls = [(mod.calls, mod.fallback_calls) for mod in m.region_modules()]
    assert calls and all(c > 0 and f == 0 for c, f in calls), calls
