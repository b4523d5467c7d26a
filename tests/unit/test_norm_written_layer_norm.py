"""The layer norm written out (Cohere's LayerNorm: float32 statistics of x - mean(x),
weight.to(float32) * y, cast back) is one layer_norm region at its rsqrt; forms that
differ stay in PyTorch with the reason."""
import pytest
import torch
import torch.nn as nn

from cutlass_offload.capture import capture
from helpers import Fn
from cutlass_offload.partition import partition
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.runtime.norm_region import NormRegionModule
from cutlass_offload.select import select
from norm_cases import CohereLayerNorm

H = torch.float16


def parts(model, x):
    cap = capture(model, (x,))
    part = partition(cap.graph_module)
    return cap, part, select(part, "sm80")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cohere_layer_norm_is_one_layer_norm_region(dtype):
    _, part, plan = parts(CohereLayerNorm(512, eps=1e-5).to(dtype), torch.randn(2, 7, 512).to(dtype))
    assert not part.fallbacks, part.fallbacks
    (r,) = part.regions
    p = r.problem
    assert (r.form, p.kind, p.eps, p.weight, p.bias, p.unit_offset) == (
        "layer_norm_decomposed", "layer_norm", 1e-5, True, False, False)
    assert r.x == "hidden_states" and r.weight == "weight"
    dt = {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    assert plan.kernels[0].name == f"rowwise_layer_norm_{dt}_vec8_weight"


def test_centred_twice_or_once_and_without_weight():
    def once(x):
        xf = x.float()
        d = xf - xf.mean(-1, keepdim=True)
        return (d * torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
    _, part, plan = parts(Fn(once), torch.randn(4, 64, dtype=H))
    (r,) = part.regions
    assert r.problem.kind == "layer_norm" and not r.problem.weight and r.problem.eps == 1e-6
    assert plan.kernels[0].name == "rowwise_layer_norm_f16_vec8_noaffine"


def test_variance_over_another_axis_stays_in_pytorch():
    def f(x):
        xf = x.float()
        m = xf.mean(0, keepdim=True)
        return ((xf - m) * torch.rsqrt((xf - m).pow(2).mean(-1, keepdim=True) + 1e-6)).half()
    _, part, _ = parts(Fn(f), torch.randn(4, 64, dtype=H))
    assert not part.regions


def test_a_different_centring_in_the_multiply_stays_in_pytorch():
    def f(x):
        xf = x.float()
        m = xf.mean(-1, keepdim=True)
        r = torch.rsqrt((xf - m).pow(2).mean(-1, keepdim=True) + 1e-6)
        return ((xf - 2 * m) * r).half()
    _, part, _ = parts(Fn(f), torch.randn(4, 64, dtype=H))
    assert not part.regions
    assert part.fallbacks and "layer norm" in part.fallbacks[0].reason


def test_fallback_subgraph_computes_coheres_norm():
    m = CohereLayerNorm(64).half()
    with torch.no_grad():
        m.weight.normal_(1, 0.5)
    cap, part, plan = parts(m, torch.randn(2, 8, 64, dtype=H))
    gm = offload(cap.graph_module, plan, library_path=None)
    (mod,) = [x for x in gm.modules() if isinstance(x, NormRegionModule)]
    x = torch.randn(3, 5, 64, dtype=H)
    values = {"hidden_states": x, "weight": m.weight.detach()}
    names = [n.name for n in mod.fallback.graph.nodes if n.op == "placeholder"]
    assert torch.equal(mod.fallback(*(values[n] for n in names)), m(x))


def test_cohere_matches_layer_norm_numerically():
    """The kernel computes F.layer_norm (biased variance, eps inside the rsqrt): the
    written-out form is that, up to float32 rounding."""
    m = CohereLayerNorm(64).float()
    with torch.no_grad():
        m.weight.normal_(1, 0.5)
    x = torch.randn(8, 64)
    ref = nn.functional.layer_norm(x, (64,), m.weight, None, 1e-5)
    assert torch.allclose(m(x), ref, atol=1e-5)
