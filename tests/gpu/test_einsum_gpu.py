"""GPU: two-operand einsums lowered to matmul / bmm (partition/einsum.py) run our
kernels: attention written with einsums (q k^T, softmax, then p v: one attention
region), a broadcast '...ij,jk' and a batch-over-n 'bnd,nde' (GEMMs); fresh inputs,
outputs poisoned, against float32."""
import pytest
import torch
import torch.nn as nn

import cutlass_offload as co
from helpers import check_fresh_outputs

pytestmark = pytest.mark.gpu


class Einsums(nn.Module):
    def forward(self, q, k, v, x, w, y, z):
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) * 0.125
        o = torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v)
        return o, torch.einsum("...ij,jk->...ik", x, w), torch.einsum("bnd,nde->bne", y, z)


def _inputs(seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = [(2, 4, 128, 64), (2, 4, 96, 64), (2, 4, 96, 64), (3, 5, 40, 64), (64, 48),
              (8, 6, 64), (6, 64, 32)]
    return tuple(torch.randn(s, generator=g, device="cuda").to(dtype) for s in shapes)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_einsum_regions_match_float32(dtype):
    m = co.compile(Einsums(), _inputs(0, dtype), arch="sm_90a")
    kinds = sorted(type(r).__name__ for r in m.plan.regions)
    assert kinds == ["AttentionRegion", "GemmRegion", "GemmRegion"], m.report.format()
    check_fresh_outputs(m, Einsums(), lambda r: _inputs(r + 1, dtype), dtype, ["o", "bc", "bne"])
    calls = [(mod.calls, mod.fallback_calls) for mod in m.region_modules()]
    assert calls and all(c > 0 and f == 0 for c, f in calls), calls
