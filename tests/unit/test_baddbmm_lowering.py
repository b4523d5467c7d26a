"""baddbmm becomes alpha * bmm + beta * input (partition/canonicalize.py), so its bmm
is a GEMM region and BLOOM's ALiBi attention scores make one attention region. No GPU,
no nvcc: the partition, and the rewritten graph's values in float64."""
import math

import pytest
import torch

from cutlass_offload.capture import capture
from cutlass_offload.ir import AttentionRegion, GemmRegion
from cutlass_offload.partition import partition
from cutlass_offload.partition.graph_utils import aten
from helpers import Fn

H = torch.float16


def bloom_attention(q, k, v, alibi):
    """transformers' BLOOM: scores = baddbmm(alibi, q, k^T, beta=1, alpha=1/sqrt(d)),
    softmax, then @ v; q, k, v (B * H, L, D), alibi (B * H, 1, L)."""
    scores = torch.baddbmm(alibi, q, k.transpose(1, 2), beta=1.0, alpha=1 / math.sqrt(q.shape[-1]))
    return torch.bmm(scores.softmax(-1), v)


FORMS = [
    (lambda c, a, b: torch.baddbmm(c, a, b), "resadd"),
    (lambda c, a, b: torch.baddbmm(c, a, b, beta=0.0, alpha=1.0), "plain"),
    (lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0), "plain"),
]


def _operands(dtype, c_shape=(6, 24, 40)):
    return torch.randn(*c_shape).to(dtype), torch.randn(6, 24, 32).to(dtype), torch.randn(6, 32, 40).to(dtype)


@pytest.mark.parametrize("case", range(len(FORMS)))
def test_baddbmm_is_a_gemm_region(case):
    fn, tag = FORMS[case]
    part = partition(capture(Fn(fn), _operands(H)).graph_module)
    (region,) = part.regions
    assert isinstance(region, GemmRegion) and region.form == "bmm"
    assert region.problem.epilogue.tag == tag
    assert not part.fallbacks


@pytest.mark.parametrize("case", range(len(FORMS)))
@pytest.mark.parametrize("c_shape", [(6, 24, 40), (6, 1, 40), (40,)])
def test_rewritten_graph_computes_baddbmm(case, c_shape):
    fn, _ = FORMS[case]
    gm = capture(Fn(fn), _operands(torch.float64, c_shape)).graph_module
    assert aten.baddbmm.default not in [n.target for n in gm.graph.nodes]
    for seed in range(2):
        torch.manual_seed(seed + 1)
        xs = _operands(torch.float64, c_shape)
        out = gm(*xs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, fn(*xs), rtol=1e-12, atol=1e-12)


def test_bloom_alibi_attention_is_one_attention_region():
    q, k, v = (torch.randn(8, 64, 32).to(H) for _ in range(3))
    alibi = torch.randn(8, 1, 64).to(H)
    part = partition(capture(Fn(bloom_attention), (q, k, v, alibi)).graph_module)
    assert [type(r) for r in part.regions] == [AttentionRegion], part
    (region,) = part.regions
    assert region.problem.bias != "none"
    assert math.isclose(region.problem.scale, 1 / math.sqrt(32), rel_tol=1e-6)
