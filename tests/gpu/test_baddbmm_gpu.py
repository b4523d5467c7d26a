"""GPU: baddbmm lowered to alpha * bmm + beta * input (partition/canonicalize.py) runs
our kernels: BLOOM's ALiBi attention (one attention region with a bias broadcast over
queries) and a baddbmm with a residual, fp16 / bf16, fresh inputs, outputs poisoned,
against float32."""
import math

import pytest
import torch
import torch.nn as nn

import cutlass_offload as co
from helpers import check_fresh_outputs

pytestmark = pytest.mark.gpu


class Bloomish(nn.Module):
    def forward(self, q, k, v, alibi, c, a, b):
        scores = torch.baddbmm(alibi, q, k.transpose(1, 2), beta=1.0, alpha=1 / math.sqrt(q.shape[-1]))
        return torch.bmm(scores.softmax(-1), v), torch.baddbmm(c, a, b)


def _inputs(seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = [(16, 128, 64), (16, 128, 64), (16, 128, 64), (16, 1, 128), (6, 48, 40), (6, 48, 32),
              (6, 32, 40)]
    return tuple(torch.randn(s, generator=g, device="cuda").to(dtype) for s in shapes)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_baddbmm_forms_match_float32(dtype):
    m = co.compile(Bloomish(), _inputs(0, dtype), arch="sm_90a")
    kinds = sorted(type(r).__name__ for r in m.plan.regions)
    assert kinds == ["AttentionRegion", "GemmRegion"], m.report.format()
    check_fresh_outputs(m, Bloomish(), lambda r: _inputs(r + 1, dtype), dtype, ["attention", "baddbmm"])
    calls = [(mod.calls, mod.fallback_calls) for mod in m.region_modules()]
    assert calls and all(c > 0 and f == 0 for c, f in calls), calls
