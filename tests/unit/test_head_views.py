"""Attention on (B * H, L, D) bmms with its scores viewed to (B, H, L, S) around the
softmax (transformers' BLOOM) becomes one attention region (partition/head_views.py):
the partition, the rewritten graph's values in float64, the forms left alone. No GPU,
no nvcc."""
import math

import pytest
import torch

from cutlass_offload.capture import capture
from cutlass_offload.ir import AttentionRegion
from cutlass_offload.partition import partition
from cutlass_offload.partition.graph_utils import aten, val
from attention_models import BLOOM_SHAPE, bloom_attention, deberta_like_attention
from helpers import Fn

H = torch.float16
B, NH, L, D = BLOOM_SHAPE


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, L, NH, 3, D, generator=g).to(dtype),
            torch.randn(B * NH, 1, L, generator=g).to(dtype))


@pytest.mark.parametrize("fp32_softmax", [True, False])
def test_bloom_attention_is_one_region_reading_qkv_in_place(fp32_softmax):
    fn = lambda qkv, alibi: bloom_attention(qkv, alibi, fp32_softmax=fp32_softmax)   # noqa: E731
    gm = capture(Fn(fn), _inputs(H)).graph_module
    part = partition(gm)
    assert [type(r) for r in part.regions] == [AttentionRegion], part
    (region,) = part.regions
    p = region.problem
    assert p.causal and p.bias != "none" and (p.heads, p.seq_q, p.head_dim) == (NH, L, D)
    assert math.isclose(p.scale, 1 / math.sqrt(D), rel_tol=1e-6)
    nodes = {n.name: n for n in gm.graph.nodes}
    # q, k and v are the strided views of qkv, not the (B * NH, L, D) copies
    for name in (region.q, region.k, region.v):
        assert val(nodes[name]).dim() == 4 and not val(nodes[name]).is_contiguous(), name
    assert not [n for n in gm.graph.nodes if n.target is aten.bmm.default]
    assert not part.fallbacks
    # the output viewed back to (B, NH, L, D) and permuted: the kernel writes (B, L, NH, D)
    assert region.out_layout == "bmhk"


@pytest.mark.parametrize("with_mask_input", [False, True])
def test_rewritten_graph_computes_the_same(with_mask_input):
    mask = torch.where(torch.rand(B, 1, L, L) < 0.2, -1e4, 0.0)
    if with_mask_input:
        fn = lambda qkv, alibi, mask: bloom_attention(qkv, alibi, mask)   # noqa: E731
        example = _inputs(torch.float64) + (mask.double(),)
    else:
        fn = bloom_attention
        example = _inputs(torch.float64)
    gm = capture(Fn(fn), example).graph_module
    assert not [n for n in gm.graph.nodes if n.target is aten.bmm.default]
    for seed in range(2):
        xs = _inputs(torch.float64, seed + 1) + ((mask.double(),) if with_mask_input else ())
        out = gm(*xs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, fn(*xs), rtol=1e-12, atol=1e-12)


def test_a_mask_passed_in_is_added_to_the_alibi_bias_first():
    """BLOOM with its attention mask given (padding): ALiBi and the mask, both inputs,
    are summed in the glue (partition/bias_sum.py) into the region's one bias."""
    mask = torch.where(torch.rand(B, 1, L, L) < 0.2, -1e4, 0.0).to(H)
    gm = capture(Fn(lambda qkv, alibi, m: bloom_attention(qkv, alibi, m)), _inputs(H) + (mask,)).graph_module
    part = partition(gm)
    (r,) = part.regions
    assert isinstance(r, AttentionRegion) and r.bias_kind == "float" and r.problem.causal == "none"
    bias = {n.name: n for n in gm.graph.nodes}[r.bias]
    assert bias.target is aten.add.Tensor and tuple(val(bias).shape) == (B, NH, L, L)
    assert any(a.op == "placeholder" for a in bias.all_input_nodes) and not part.fallbacks   # the mask


def test_two_biases_one_constant_but_not_causal_say_so():
    """A compile-time bias that is not a causal pattern is not summed with the other
    (such a mask might fold): the reason says what to do."""
    class Biased(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("pattern", torch.randn(1, 1, L, L).to(H))

        def forward(self, qkv, alibi):
            return bloom_attention(qkv, alibi, self.pattern)
    part = partition(capture(Biased(), _inputs(H)).graph_module)
    assert not [r for r in part.regions if isinstance(r, AttentionRegion)]
    assert any("two biases" in f.reason for f in part.fallbacks), part.fallbacks


def _split_without_softmax(x, y):
    s = torch.bmm(x, y).view(B, NH, L, L)
    return torch.bmm((s * 2.0).view(B * NH, L, L), y)


def test_a_bmm_viewed_without_a_softmax_is_left_alone():
    x, y = torch.randn(B * NH, L, L).to(H), torch.randn(B * NH, L, L).to(H)
    gm = capture(Fn(_split_without_softmax), (x, y)).graph_module
    assert len([n for n in gm.graph.nodes if n.target is aten.bmm.default]) == 2


def test_transformers_bloom_attention_regions():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BloomConfig(vocab_size=256, hidden_size=128, n_layer=2, n_head=4, use_cache=False)
    model = transformers.BloomForCausalLM(cfg).half().eval()
    ids = torch.randint(0, 256, (2, 32))

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids):
            return self.m(ids).logits

    part = partition(capture(Logits(), (ids,)).graph_module)
    att = [r for r in part.regions if isinstance(r, AttentionRegion)]
    assert len(att) == 2, part
    assert all(r.problem.causal and r.problem.bias != "none" for r in att)


def test_a_view_to_the_same_shape_between_softmax_and_pv_is_dropped():
    def fn(q, k, v, alibi):
        s = torch.baddbmm(alibi, q, k.transpose(1, 2), alpha=1 / math.sqrt(D))
        return torch.bmm(s.softmax(-1).view(B * NH, L, L), v)
    xs = tuple(torch.randn(B * NH, L, D).to(H) for _ in range(3)) + (torch.randn(B * NH, 1, L).to(H),)
    part = partition(capture(Fn(fn), xs).graph_module)
    assert [type(r) for r in part.regions] == [AttentionRegion], part


def test_a_dynamic_batch_split_by_minus_one_is_rewritten():
    """DeBERTa's ``scores.view(-1, H, L, S)``: with a dynamic batch the -1 stays
    symbolic (fresh-user trial, session 55: the attention was lost under dynamic_batch)."""
    fn = deberta_like_attention
    gm = capture(Fn(fn), (torch.randn(B * NH, L, D).to(H),), dynamic_batch=True).graph_module
    part = partition(gm)
    assert [type(r) for r in part.regions] == [AttentionRegion], part
    assert part.regions[0].problem.batch is None          # dynamic
