"""GPU: Swin-V2's cosine attention, its per-head logit scale moved onto q
(partition/logit_scale.py), runs as one attention region with the position bias:
fp16 / bf16, fresh inputs, outputs poisoned, against float32. Eager glue: the regions' kernels are what is tested."""
import pytest
import torch

import cutlass_offload as co
from attention_models import cosine_attention
from cutlass_offload.ir import AttentionRegion
from helpers import assert_regions_ran, check_fresh_outputs

pytestmark = pytest.mark.gpu
B, H, L, D = 2, 4, 64, 32


class Cosine(torch.nn.Module):
    def forward(self, q, k, v, logit_scale, bias):
        return (cosine_attention(q, k, v, logit_scale, bias),)


def _inputs(seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g, device="cuda").to(dtype) for _ in range(3))
    scale = torch.log(10 * torch.rand(H, 1, 1, generator=g, device="cuda") + 1).to(dtype)
    return q, k, v, scale, torch.randn(1, H, L, L, generator=g, device="cuda").to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cosine_attention_matches_float32(dtype):
    m = co.compile(Cosine(), _inputs(0, dtype), arch="sm_90a", glue="eager")
    assert [type(r) for r in m.plan.regions] == [AttentionRegion], m.report.format()
    check_fresh_outputs(m, Cosine(), lambda r: _inputs(r + 1, dtype), dtype, ["attention"])
    assert_regions_ran(m)
