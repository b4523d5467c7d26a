"""GPU: sibling linears combined into one GEMM (partition/parallel_gemm.py). A
BERT-style self-attention block whose q / k / v projections (k without a bias, v
narrower than q) and a cross attention's k / v on a second input run as two
combined GEMMs; the attention kernels read the slices of their outputs in place.
Both glues, a dynamic batch, fresh inputs, outputs poisoned, against float32."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cutlass_offload as co
from cutlass_offload.ir import GemmRegion
from helpers import TOLERANCE, poison_allocator, rel_err

pytestmark = pytest.mark.gpu


class Block(nn.Module):
    def __init__(self, d=256, heads=4, ctx=192):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d, bias=False), nn.Linear(d, d)
        self.ck, self.cv = nn.Linear(ctx, d, bias=False), nn.Linear(ctx, d, bias=False)
        self.o = nn.Linear(d, d)

    def _heads(self, t):
        b, s, d = t.shape
        return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x, c):
        b, s, d = x.shape
        a = F.scaled_dot_product_attention(self._heads(self.q(x)), self._heads(self.k(x)),
                                           self._heads(self.v(x)))
        a = a.transpose(1, 2).reshape(b, s, d)
        a = F.scaled_dot_product_attention(self._heads(a), self._heads(self.ck(c)),
                                           self._heads(self.cv(c)))
        return self.o(a.transpose(1, 2).reshape(b, s, d)) + x


def _inputs(batch, seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(batch, 128, 256, generator=g, device="cuda").to(dtype),
            torch.randn(batch, 64, 192, generator=g, device="cuda").to(dtype))


@pytest.mark.parametrize("glue", ["eager", "inductor"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_combined_projections_match_float32(glue, dtype):
    torch.manual_seed(0)
    eager = Block().to("cuda", dtype).eval()
    ref = copy.deepcopy(eager).float()
    torch._dynamo.reset()
    try:
        m = co.compile(eager, _inputs(2, 0, dtype), glue=glue, dynamic_batch=True)
        combined = [r for r in m.plan.regions if isinstance(r, GemmRegion)
                    and any("combines" in n for n in r.notes)]
        assert sorted(r.problem.n for r in combined) == [512, 768]   # k + v of c; q + k + v
        assert not m.plan.fallbacks, m.report
        with torch.no_grad():
            for batch, seed in ((2, 1), (3, 2), (2, 3)):
                x, c = _inputs(batch, seed, dtype)
                poison_allocator()
                out = m(x, c)
                err = rel_err(out, ref(x.float(), c.float()))
                assert err < TOLERANCE[dtype], (glue, batch, seed, err)
    finally:
        torch._dynamo.reset()
