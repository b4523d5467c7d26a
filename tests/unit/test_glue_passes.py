"""The glue's SDPA rewrites (runtime/glue_passes.py): layout copies that feed only
SDPA's q / k / v dropped, a query's constant factor folded into SDPA's scale; the
rewritten graph against the captured one on fresh inputs, the copies and factors
that must stay, and the Inductor glue (on the CPU) compiled with them."""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cutlass_offload.capture import capture
from cutlass_offload.ir.attention import AttentionProblem
from cutlass_offload.select import pytorch_faster
from cutlass_offload.runtime import glue
from cutlass_offload.runtime.glue_passes import (SDPA, drop_sdpa_input_copies, fold_sdpa_query_scale,
                                                 rewrite_for_sdpa)
from glue_helpers import HFAttention, offloaded, regions_on_cpu

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _factor_left_on_q(monkeypatch):
    """Capture leaves a query's factor in the graph here: partition's canonicalize folds
    it itself since session 43 (the same pass, through layout copies), so a glue graph
    keeps one only where canonicalize did not apply; these tests are about the glue's pass."""
    from cutlass_offload.partition import canonicalize
    monkeypatch.setattr(canonicalize, "fold_sdpa_query_scale", lambda gm, **kw: 0)


def _graph(model, *inputs):
    return capture(model.eval(), inputs).graph_module


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _sdpa(gm):
    return next(n for n in gm.graph.nodes if n.target is SDPA)


@pytest.mark.parametrize("scale_op,sdpa_scale,factor", [("mul", 1.0, 0.125), ("div", None, 1 / 3.0)])
def test_whisper_attention_loses_its_copies_and_its_query_factor(scale_op, sdpa_scale, factor):
    torch.manual_seed(0)
    model = HFAttention(scale_op=scale_op, sdpa_scale=sdpa_scale)
    gm = _graph(model, torch.randn(2, 10, 64))
    new = copy.deepcopy(gm)
    assert rewrite_for_sdpa(new) == {"sdpa_input_copies_dropped": 3, "sdpa_scales_folded": 1}
    sdpa = _sdpa(new)
    assert all(a.target is aten.transpose.int for a in sdpa.args[:3])      # the views, read in place
    expected = (1.0 if sdpa_scale is not None else 1 / math.sqrt(16)) * factor
    assert sdpa.kwargs["scale"] == pytest.approx(expected, rel=1e-12)
    assert aten.mul.Tensor not in _targets(new) and aten.div.Tensor not in _targets(new)
    assert _targets(new).count(aten.contiguous.default) == 1                # the head merge's stays
    for seed in (1, 2):
        x = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(seed))   # fresh inputs
        ref = model.double()(x.double())
        model.float()
        out = new(x)
        assert (out - ref).abs().max().item() < 1e-5 * ref.abs().max().item() + 1e-6
        torch.testing.assert_close(out, gm(x), rtol=1e-5, atol=1e-6)


class CopyUsedElsewhere(nn.Module):
    def forward(self, q, k):
        kc = k.transpose(1, 2).contiguous()
        return F.scaled_dot_product_attention(q, kc, kc), kc.sum()


class LastDimStrided(nn.Module):
    def forward(self, q, k):
        kt = k.transpose(-1, -2).contiguous()            # a real re-layout: its last dim is strided
        return F.scaled_dot_product_attention(q, kt, kt)


class ChannelsLastClone(nn.Module):
    def forward(self, q, k):
        kc = k.clone(memory_format=torch.channels_last)
        return F.scaled_dot_product_attention(q, kc, kc)


class CopyAsMask(nn.Module):
    def forward(self, q, m):
        mc = m.transpose(-1, -2).transpose(-1, -2).contiguous()
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mc)


@pytest.mark.parametrize("module,inputs", [
    (CopyUsedElsewhere(), (torch.randn(2, 4, 6, 8), torch.randn(2, 6, 4, 8))),
    (LastDimStrided(), (torch.randn(2, 4, 6, 8), torch.randn(2, 4, 8, 6))),
    (ChannelsLastClone(), (torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8))),
    (CopyAsMask(), (torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 6))),
], ids=["other-use", "strided-last-dim", "channels-last", "mask"])
def test_copies_that_are_not_layout_only_for_sdpa_stay(module, inputs):
    gm = _graph(module, *inputs)
    before = _targets(gm)
    assert drop_sdpa_input_copies(gm) == 0
    assert _targets(gm) == before


class FactorUsedTwice(nn.Module):
    def forward(self, x):
        q = x * 0.5
        return F.scaled_dot_product_attention(q, x, x), q


class TensorFactor(nn.Module):
    def forward(self, x, s):
        return F.scaled_dot_product_attention(x * s, x, x)


class FactorOnKey(nn.Module):
    def forward(self, x):
        return F.scaled_dot_product_attention(x, x * 0.5, x)


class FactorOnQueryAndKey(nn.Module):
    def forward(self, x, v):
        q = (x * 0.5).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, v)


class NegativeFactor(nn.Module):
    def forward(self, x):
        return F.scaled_dot_product_attention(x * -0.5, x, x)


@pytest.mark.parametrize("module,inputs", [
    (FactorOnQueryAndKey(), (torch.randn(2, 6, 4, 8), torch.randn(2, 4, 6, 8))),
    (NegativeFactor(), (torch.randn(2, 4, 6, 8),)),
    (FactorUsedTwice(), (torch.randn(2, 4, 6, 8),)),
    (TensorFactor(), (torch.randn(2, 4, 6, 8), torch.randn(8))),
    (FactorOnKey(), (torch.randn(2, 4, 6, 8),)),
], ids=["query-is-key", "negative", "used-twice", "tensor-factor", "on-key"])
def test_factors_that_cannot_move_stay(module, inputs):
    gm = _graph(module, *inputs)
    assert fold_sdpa_query_scale(gm) == 0
    assert "scale" not in _sdpa(gm).kwargs


def test_inductor_glue_compiles_the_rewritten_copy_and_leaves_the_model(monkeypatch):
    """The glue copy is rewritten (counts on the InductorGlue), the offloaded graph
    that eager glue runs is not, and both give the captured model's result."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = HFAttention().eval()
    x = torch.randn(2, 10, 64)
    real = pytorch_faster.reason             # as the measured-faster list does for whisper's attention
    monkeypatch.setattr(pytorch_faster, "reason", lambda p, *a, **k: "test: SDPA" if isinstance(
        p, AttentionProblem) else real(p, *a, **k))
    model = offloaded(eager, (x,))
    assert any(n.target is SDPA for n in model.graph_module.graph.nodes), \
        "the attention is expected to stay in PyTorch"
    regions_on_cpu(monkeypatch)
    monkeypatch.setattr(glue, "SDPA_REWRITES", True)
    model.set_glue("inductor")
    with torch.no_grad():
        out, ref = model(x), eager(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert model.inductor.rewrites == {"sdpa_input_copies_dropped": 3, "sdpa_scales_folded": 1}
    assert aten.contiguous.default in _targets(model.graph_module)     # the model's graph as it was
    torch._dynamo.reset()


class CrossAttention(HFAttention):
    """q from x alone, k and v from y: q's GEMM region has no sibling to share a
    combined GEMM with, so q * c reads a region op's output directly."""

    def forward(self, x, y):
        b, n, d = x.shape
        q = self.split(self.q(x) * 0.125)
        a = F.scaled_dot_product_attention(q, self.split(self.k(y)), self.split(self.v(y)), scale=1.0)
        return self.o(a.transpose(1, 2).contiguous().reshape(b, n, d))


def test_a_factor_on_a_region_output_folds(monkeypatch):
    """ops_graph gives each region op node the region's output value (meta "val"),
    which the fold needs to see that q * c keeps q's dtype."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = CrossAttention().eval()
    x, y = torch.randn(2, 10, 64), torch.randn(2, 12, 64)
    real = pytorch_faster.reason
    monkeypatch.setattr(pytorch_faster, "reason", lambda p, *a, **k: "test: SDPA" if isinstance(
        p, AttentionProblem) else real(p, *a, **k))
    model = offloaded(eager, (x, y))
    og = glue.ops_graph(model.graph_module)
    ops_nodes = [n for n in og.graph_module.graph.nodes if str(n.target).startswith("cutlass_offload.region_")]
    assert ops_nodes and all(isinstance(n.meta.get("val"), torch.Tensor) for n in ops_nodes)
    mul = next(n for n in og.graph_module.graph.nodes if n.target is aten.mul.Tensor)
    assert mul.args[0] in ops_nodes                       # the case under test
    assert rewrite_for_sdpa(og.graph_module) == {"sdpa_input_copies_dropped": 3, "sdpa_scales_folded": 1}
    regions_on_cpu(monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(og.graph_module(x, y), eager(x, y), rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
