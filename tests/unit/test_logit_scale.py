"""A per-head logit scale (Swin-V2's cosine attention: ``(q @ k^T) * s``, s of shape
(H, 1, 1)) moves onto q (partition/logit_scale.py), so the attention is one region:
the partition, the rewritten graph's values in float64, the forms left alone. No GPU,
no nvcc."""
import math

import pytest
import torch

from attention_models import cosine_attention
from cutlass_offload.capture import capture
from cutlass_offload.ir import AttentionRegion
from cutlass_offload.partition import partition
from helpers import Fn

B, H, L, D = 2, 4, 64, 32


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g).to(dtype) for _ in range(3))
    scale = torch.log(10 * torch.rand(H, 1, 1, generator=g) + 1).to(dtype)
    return q, k, v, scale, torch.randn(1, H, L, L, generator=g).to(dtype)


def test_cosine_attention_is_one_region():
    part = partition(capture(Fn(cosine_attention), _inputs(torch.float16)).graph_module)
    assert [type(r) for r in part.regions] == [AttentionRegion], part
    (r,) = part.regions
    assert r.problem.bias != "none" and math.isclose(r.problem.scale, 1.0)
    assert not part.fallbacks


def test_rewritten_graph_computes_the_same():
    gm = capture(Fn(cosine_attention), _inputs(torch.float64)).graph_module
    matmuls = [n for n in gm.graph.nodes if n.target is torch.ops.aten.matmul.default]
    assert any(n.args[0].target is torch.ops.aten.mul.Tensor for n in matmuls)     # q * s
    for seed in range(2):
        xs = _inputs(torch.float64, seed + 1)
        out = gm(*xs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, cosine_attention(*xs), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(H, L, 1), (1, 1, L)])
def test_a_factor_varying_over_queries_or_keys_stays(shape):
    def fn(q, k, v, s):
        return ((q @ k.transpose(-2, -1)) * s).softmax(-1) @ v
    q, k, v, _, _ = _inputs(torch.float16)
    gm = capture(Fn(fn), (q, k, v, torch.rand(*shape).half())).graph_module
    mms = [n for n in gm.graph.nodes if n.target is torch.ops.aten.matmul.default]
    assert not any(n.args[0].target is torch.ops.aten.mul.Tensor for n in mms)


def test_a_factor_that_stays_is_the_op_the_fallback_names():
    """A factor varying over queries is not moved; the fallback names the multiply that
    hides the matmul, not the bias add above it (fresh-user trial, session 55)."""
    def fn(q, k, v, s, bias):
        return ((q @ k.transpose(-2, -1)) * s + bias).softmax(-1) @ v
    q, k, v, _, bias = _inputs(torch.float16)
    part = partition(capture(Fn(fn), (q, k, v, torch.rand(H, L, 1).half(), bias)).graph_module)
    (fb,) = [f for f in part.fallbacks if f.op == "softmax_attention"]
    assert "aten.mul.Tensor between q @ k^T and the softmax" in fb.reason, fb.reason
