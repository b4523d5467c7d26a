"""GPU property tests (hypothesis) of the epilogue activations added for issue 19:
hardswish, hardsigmoid and quick_gelu (x * sigmoid(1.702 x)), fused into GEMMs
(CUTLASS 3.x EVT on sm_90a, 2.x for misaligned N) and convs (TMA implicit GEMM,
the im2col lowering, 2.x), against a float32 reference on fresh random inputs with
outputs poisoned first. As in test_gemm_properties.py / test_conv_properties.py:
compiled once from prototypes, M (GEMMs) or the whole conv geometry (convs) drawn
at run time; CUTLASS_OFFLOAD_PROPERTY_EXAMPLES=500 runs that many random examples.
"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import cutlass_offload as co
from helpers import (TOLERANCE, check_conv_call, conv_operands, conv_region_module, draw_conv_problem,
                     poison_allocator, property_settings, rel_err)

pytestmark = pytest.mark.gpu
PROPERTY_SETTINGS = property_settings()
H, B16 = torch.float16, torch.bfloat16


def quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


ACT = {"hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "quick_gelu": quick_gelu}

# (name, dtype, K, N, weight stored (N, K)?, epilogue fn(y, bias, r)); N = 7 / 9: 2.x
GEMMS = [
    ("tma_hardswish", H, 40, 72, True, lambda y, b, r: F.hardswish(y + b)),
    ("tma_bf16_hardsigmoid_res", B16, 96, 80, False, lambda y, b, r: F.hardsigmoid(y + b) + r),
    ("tma_quick_gelu", H, 64, 64, True, lambda y, b, r: quick_gelu(y + b)),
    ("sm80_quick_gelu_mul", H, 13, 7, True, lambda y, b, r: quick_gelu(y + b) * r),
    ("sm80_bf16_hardswish", B16, 24, 9, True, lambda y, b, r: F.hardswish(y)),
]


class GemmModel(torch.nn.Module):
    def forward(self, *xs):
        outs = []
        for i, (_, _, _, _, nk, fn) in enumerate(GEMMS):
            x, w, b, r = xs[4 * i:4 * i + 4]
            outs.append(fn(x @ (w.t() if nk else w), b, r))
        return tuple(outs)


def _gemm_inputs(ms, device="cpu", scale=1.0):
    xs = []
    for (_, dt, k, n, nk, _), m in zip(GEMMS, ms):
        w = torch.randn(*((n, k) if nk else (k, n))) / k ** 0.5
        xs += [t.to(device=device, dtype=dt) for t in
               (torch.randn(m, k) * scale, w, torch.randn(n), torch.randn(m, n))]
    return tuple(xs)


@pytest.fixture(scope="module")
def gemms():
    specs = []
    for i in range(len(GEMMS)):
        m = torch.export.Dim(f"m{i}", min=2, max=512)
        specs += [{0: m}, None, None, {0: m}]
    cap = co.capture(GemmModel(), _gemm_inputs([37] * len(GEMMS)), dynamic_shapes=(tuple(specs),))
    model = co.compile_captured(cap, co.CompileOptions(arch=co.resolve_arch(None))).to("cuda")
    acts = [r.problem.epilogue.activation for r in model.plan.regions]
    assert acts == ["hardswish", "hardsigmoid", "quick_gelu", "quick_gelu", "hardswish"], model.report.format()
    if model.plan.arch == "sm90a":
        fams = [m.kernel.config.family for m in model.region_modules()]
        assert fams == ["cutlass3x_sm90"] * 3 + ["cutlass2x_sm80"] * 2, fams
    return model


@PROPERTY_SETTINGS
@given(data=st.data())
def test_gemm_activations_match_float32_reference(gemms, data):
    ms = [data.draw(st.integers(2, 300)) for _ in GEMMS]
    scale = data.draw(st.sampled_from([1.0, 1e-2, 4.0]))
    xs = _gemm_inputs(ms, "cuda", scale)
    before = sum(m.fallback_calls for m in gemms.region_modules())
    poison_allocator()
    with torch.no_grad():
        outs = gemms(*xs)
    assert sum(m.fallback_calls for m in gemms.region_modules()) == before
    for i, (name, dt, _, _, nk, fn) in enumerate(GEMMS):
        x, w, b, r = (t.float() for t in xs[4 * i:4 * i + 4])
        ref = fn(x @ (w.t() if nk else w), b, r)
        assert not outs[i].isnan().any(), f"{name} m={ms[i]}: unwritten output"
        err = rel_err(outs[i], ref)
        assert err < TOLERANCE[dt], f"{name} m={ms[i]} scale={scale}: rel. error {err:.2e}"


# (name, dtype, prototype C, K, activation, residual, R = S); C = 4: the im2col
# lowering on sm_90a; K = 21: 2.x
CONVS = [
    ("tma_hardswish", H, 32, 64, "hardswish", "none", 3),
    ("tma_bf16_quick_gelu_res", B16, 16, 32, "quick_gelu", "full_add", 3),
    ("im2col_hardsigmoid", H, 4, 32, "hardsigmoid", "none", 3),
    ("sm80_k_odd_quick_gelu", H, 12, 21, "quick_gelu", "none", 3),
]


def conv_class(cls, x, w, b, r, pad, stride, dilation):
    top, bottom, left, right = pad
    y = ACT[cls[4]](F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, stride=stride, dilation=dilation))
    return y + r if cls[5] == "full_add" else y


class ConvPrototypes(torch.nn.Module):
    def forward(self, *xs):
        outs = []
        for i, cls in enumerate(CONVS):
            p = cls[6] // 2
            outs.append(conv_class(cls, *xs[4 * i:4 * i + 4], (p, p, p, p), (1, 1), (1, 1)))
        return tuple(outs)


@pytest.fixture(scope="module")
def convs():
    xs = []
    for _, dt, c, k, _, res, rs in CONVS:
        r = torch.randn(2, k, 8, 8) if res == "full_add" else torch.zeros(0)
        xs += [torch.randn(2, c, 8, 8).to(dt).contiguous(memory_format=torch.channels_last),
               torch.randn(k, c, rs, rs).to(dt), torch.randn(k).to(dt),
               r.to(dt).contiguous(memory_format=torch.channels_last) if r.dim() == 4 else r.to(dt)]
    compiled = co.compile(ConvPrototypes(), tuple(xs)).to("cuda")
    mods = compiled.region_modules()
    assert [m.region.problem.epilogue.activation for m in mods] == [c[4] for c in CONVS], \
        compiled.report.format()
    return mods


@PROPERTY_SETTINGS
@given(data=st.data())
def test_conv_activations_match_float32_reference(convs, data):
    for cls, proto in zip(CONVS, convs):
        name, dt, _, _, _, res, _ = cls
        p, pad, stride, dilation = draw_conv_problem(data, name, proto)
        x, wt, b = conv_operands(p.n, p.c, p.h, p.w, p.k, p.r, p.s, dt)
        check_conv_call(conv_region_module(proto, p), f"{name} {p}", x, wt, b, res, p.k,
                        lambda *t: conv_class(cls, *t, pad, stride, dilation))
