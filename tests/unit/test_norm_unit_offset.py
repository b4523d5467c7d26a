"""Zero-centred norm weights, scaled by 1 + weight (Gemma's RMSNorm, Nemotron's
LayerNorm1P): read as the weight with ``unit_offset``, the add and the cast join the
region, the kernel computes 1 + weight in fp32."""
import pytest
import torch
import torch.nn as nn

from cutlass_offload.capture import capture
from cutlass_offload.emit import emit_kernel
from cutlass_offload.ir import NormKernel, NormProblem
from cutlass_offload.partition import partition
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.runtime.norm_region import NormRegionModule
from cutlass_offload.select import select
from norm_cases import GemmaRMSNorm, LayerNorm1P, LlamaRMSNorm

H = torch.float16


class Fn(nn.Module):
    def __init__(self, fn, dim=64):
        super().__init__()
        self.fn = fn
        self.weight = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return self.fn(x, self.weight)


def parts(model, x):
    part = partition(capture(model, (x,)).graph_module)
    return part, select(part, "sm80")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemma_rms_norm_is_one_region_with_unit_offset(dtype):
    part, plan = parts(GemmaRMSNorm(256).to(dtype), torch.randn(2, 9, 256).to(dtype))
    assert not part.fallbacks, part.fallbacks
    (r,) = part.regions
    p = r.problem
    assert (r.form, p.kind, p.eps, p.weight, p.unit_offset) == ("rms_norm_decomposed", "rms_norm",
                                                                1e-6, True, True)
    assert r.weight == "weight" and r.x == "x"
    assert r.nodes[-1] == "type_as"              # the cast back ends the region
    (k,) = plan.kernels
    dt = {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    assert k.name == f"rowwise_rms_norm_{dt}_vec8_weight1p" and k.unit_offset


def test_layer_norm_1p_folds_the_add():
    part, plan = parts(LayerNorm1P(192).half(), torch.randn(4, 192, dtype=H))
    (r,) = part.regions
    assert r.problem.unit_offset and r.problem.bias and r.weight == "weight"
    assert r.nodes[0].startswith("add") and r.nodes[-1] == "layer_norm"
    assert plan.kernels[0].name == "rowwise_layer_norm_f16_vec8_weight1p_bias"


def test_plain_forms_keep_their_kernels():
    part, plan = parts(LlamaRMSNorm(64).half(), torch.randn(2, 64, dtype=H))
    assert not part.regions[0].problem.unit_offset
    assert plan.kernels[0].name == "rowwise_rms_norm_f16_vec8_weight"


def _rms(x):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_an_offset_other_than_one_stays_in_pytorch_with_the_reason():
    part, _ = parts(Fn(lambda x, w: (_rms(x) * (2.0 + w.float())).type_as(x)).half(),
                    torch.randn(4, 64, dtype=H))
    assert not part.regions
    (fb,) = part.fallbacks
    assert fb.op == "rms_norm" and "not a weight vector the kernel takes" in fb.reason


def test_the_offset_weight_used_elsewhere_stays_in_pytorch():
    def f(x, w):
        w1 = 1.0 + w.float()
        return (_rms(x) * w1).type_as(x), w1
    part, _ = parts(Fn(f).half(), torch.randn(4, 64, dtype=H))
    assert not part.regions
    assert "used outside the norm" in part.fallbacks[0].reason


def test_an_offset_weight_of_another_dtype_stays_in_pytorch():
    m = Fn(lambda x, w: (_rms(x) * (1.0 + w)).type_as(x))      # fp32 weight, fp16 x
    part, _ = parts(m, torch.randn(4, 64, dtype=H))
    assert not part.regions
    assert "differs from the input" in part.fallbacks[0].reason


def test_kernel_source_scales_by_one_plus_weight():
    src = emit_kernel(NormKernel("sm90a", "rms_norm", "f16", 8, True, False, unit_offset=True)).code
    assert "constexpr bool kUnitOffset = true;" in src and "1.f + fw[j]" in src
    plain = emit_kernel(NormKernel("sm90a", "rms_norm", "f16", 8, True, False)).code
    assert "constexpr bool kUnitOffset = false;" in plain


def test_unit_offset_needs_a_weight():
    with pytest.raises(ValueError, match="needs a weight"):
        NormKernel("sm90a", "rms_norm", "f16", 8, False, False, unit_offset=True)
    with pytest.raises(ValueError, match="needs a weight"):
        NormProblem("rms_norm", "f16", cols=64, eps=1e-6, align=8, unit_offset=True)


def test_summary_names_the_offset_only_when_set():
    p = NormProblem("rms_norm", "f16", cols=64, eps=1e-6, align=8, weight=True)
    assert "unit_offset" not in p.summary()["norm"]
    q = NormProblem("rms_norm", "f16", cols=64, eps=1e-6, align=8, weight=True, unit_offset=True)
    assert q.summary()["norm"]["unit_offset"] is True


@pytest.mark.parametrize("make", [lambda: GemmaRMSNorm(64).half(), lambda: LayerNorm1P(64).half()])
def test_fallback_subgraph_computes_the_original(make):
    """The region's inputs are x and the stored weight (the add and cast are inside):
    its PyTorch fallback recomputes 1 + weight and equals the module."""
    m = make()
    with torch.no_grad():
        m.weight.normal_(0, 0.5)
    cap = capture(m, (torch.randn(2, 8, 64, dtype=H),))
    gm = offload(cap.graph_module, select(partition(cap.graph_module), "sm80"), library_path=None)
    (mod,) = [x for x in gm.modules() if isinstance(x, NormRegionModule)]
    x = torch.randn(3, 5, 64, dtype=H)
    values = {"x": x, "weight": m.weight.detach(), "bias": getattr(m, "bias", None)}
    names = [n.name for n in mod.fallback.graph.nodes if n.op == "placeholder"]
    assert names == (["x", "weight"] if isinstance(m, GemmaRMSNorm) else ["weight", "x", "bias"])
    assert torch.equal(mod.fallback(*(values[n] for n in names)), m(x))
