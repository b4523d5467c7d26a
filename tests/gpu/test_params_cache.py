"""GPU: the launchers' Params cache (prelude.h CoParamsCache) never serves a call the
Params of another. An sm90a GEMM with a fused epilogue (bias, GELU, residual), a TMA
implicit-GEMM conv and a Hopper attention are called on more distinct tensors than a
launcher keeps (16), twice round (hits for the recent, misses for the evicted), with
the inputs' contents changed in place between rounds and a second batch size in
between; every output poisoned first and checked against float32. A hit with the
wrong Params writes elsewhere or reads stale operands: the output stays NaN or
matches the old inputs."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cutlass_offload as co
from helpers import TOLERANCE, poison_allocator, rel_err

pytestmark = pytest.mark.gpu

DISTINCT = 20        # above the 16 Params a launcher keeps


class Block(nn.Module):
    """A GEMM with a fused epilogue, a 3x3 conv + bias + ReLU and an attention."""

    def __init__(self, d=128, heads=2):
        super().__init__()
        self.heads = heads
        self.lin = nn.Linear(d, d)
        self.conv = nn.Conv2d(64, 64, 3, padding=1)

    def forward(self, x, img):
        y = F.gelu(self.lin(x)) + x
        b, s, d = y.shape
        q = y.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(b, s, d)
        return a, torch.relu(self.conv(img))


def _inputs(batch, gen, dtype):
    x = torch.randn(batch, 64, 128, generator=gen, device="cuda").to(dtype)
    img = torch.randn(batch, 64, 16, 16, generator=gen, device="cuda").to(dtype)
    return x, img.contiguous(memory_format=torch.channels_last)


def _check(m, ref, xs, dtype, where):
    poison_allocator()
    with torch.no_grad():
        outs = m(*xs)
        refs = ref(*(t.float() for t in xs))
    for out, want, what in zip(outs, refs, ("gemm + attention", "conv")):
        err = rel_err(out, want)
        assert err < TOLERANCE[dtype], (where, what, err)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_repeated_and_rotating_calls_match_float32(dtype):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU (sm_90a kernels)")
    torch.manual_seed(0)
    eager = Block().to("cuda", dtype).eval()
    ref = copy.deepcopy(eager).float()
    gen = torch.Generator(device="cuda").manual_seed(1)
    m = co.compile(eager, _inputs(2, gen, dtype), arch="sm_90a", dynamic_batch=True)
    kinds = {type(r).__name__ for r in m.plan.regions}
    assert {"GemmRegion", "ConvRegion", "AttentionRegion"} <= kinds, m.report
    held = [_inputs(2, gen, dtype) for _ in range(DISTINCT)]    # kept alive: distinct addresses
    for round_ in range(2):
        for i, xs in enumerate(held):
            _check(m, ref, xs, dtype, (round_, i))
            _check(m, ref, xs, dtype, (round_, i, "again"))          # the same call: a hit
        for xs in held:                                               # new contents, same tensors
            for t, new in zip(xs, _inputs(2, gen, dtype)):
                t.copy_(new)
        _check(m, ref, _inputs(3, gen, dtype), dtype, (round_, "batch 3"))
    calls = {mod.region.name: (mod.calls, mod.fallback_calls) for mod in m.region_modules()}
    assert calls and all(c > 0 and f == 0 for c, f in calls.values()), calls   # the kernels ran
