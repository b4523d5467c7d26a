"""GPU: attention of head dim 512 (the SD VAE's) as two GEMM regions and a softmax
(partition/wide_attention.py), eager and Inductor glue, a dynamic batch, fresh inputs,
outputs poisoned, against float64 SDPA; ours within 3x PyTorch's own SDPA error."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cutlass_offload as co
from cutlass_offload.ir import AttentionRegion, GemmRegion
from helpers import poison_allocator, rel_err

pytestmark = pytest.mark.gpu


class VaeStyleAttention(nn.Module):
    """One head over h * w tokens of c channels, SDPA with its default scale."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def _qkv(batch, seed, dtype, tokens=1024, e=512):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(batch, 1, tokens, e, generator=g, device="cuda").to(dtype)
                 for _ in range(3))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("glue", ["eager", "inductor"])
def test_head_dim_512_runs_as_two_gemms_within_pytorchs_error(dtype, glue):
    torch.manual_seed(0)
    m = co.compile(VaeStyleAttention(), _qkv(2, 0, dtype), dynamic_batch=True, glue=glue)
    gemms = [r for r in m.plan.regions if isinstance(r, GemmRegion)]
    assert len(gemms) == 2 and not any(isinstance(r, AttentionRegion) for r in m.plan.regions)
    assert all(any("two GEMMs and a softmax" in n for n in r.notes) for r in gemms), m.report
    with torch.no_grad():
        for batch, seed in ((2, 1), (3, 2), (1, 3)):
            q, k, v = _qkv(batch, seed, dtype)
            want = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
            theirs = rel_err(F.scaled_dot_product_attention(q, k, v), want)
            poison_allocator()
            out = m(q, k, v)
            assert torch.isfinite(out).all()
            err = rel_err(out, want)
            assert err < 3 * theirs + 1e-4, (glue, batch, seed, err, theirs)
    calls = {mod.region.name: (mod.calls, mod.fallback_calls) for mod in m.region_modules()}
    assert calls and all(c > 0 and f == 0 for c, f in calls.values()), calls   # the kernels ran
