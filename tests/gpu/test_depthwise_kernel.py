"""GPU: depthwise conv2d regions (the direct depthwise kernel, families/depthwise.py).

Property tests (hypothesis) as in test_conv_properties.py: one library built from
prototype regions, one per kernel class (dtype, filter width, horizontal stride,
epilogue); every other size is a run-time argument, so hypothesis draws N, C, H, W,
R, padding (asymmetric) and the vertical stride freely and runs the class's kernel
on them through a ConvRegionModule bound to the same symbol, against a float32
reference. CUTLASS_OFFLOAD_PROPERTY_EXAMPLES=100 runs 100 random problems per class.
Then whole models (a ConvNeXt block, an inverted residual's depthwise + SiLU) under
eager and Inductor glue.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

import cutlass_offload as co
from cutlass_offload.ir import replace
from helpers import (check_batches, check_conv_call, conv_region_module, property_settings,
                     prototype_regions)

pytestmark = pytest.mark.gpu
PROPERTY_SETTINGS = property_settings()

ACT = {"relu": torch.relu, "silu": F.silu, "gelu": F.gelu, "none": lambda y: y}
# (name, dtype, filter width S (= R in the prototype), horizontal stride, act, residual)
CLASSES = [
    ("dw7", torch.float16, 7, 1, "none", "none"),
    ("dw3_s2_silu_bf16", torch.bfloat16, 3, 2, "silu", "none"),
    ("dw5_relu_res", torch.float16, 5, 1, "relu", "full_add"),
    ("dw3_gelu_chmul", torch.float16, 3, 1, "gelu", "channel_mul"),
    ("dw5_s2_bf16", torch.bfloat16, 5, 2, "none", "none"),
]


def forward_class(cls, x, w, b, r, pad, stride):
    act, res = cls[4], cls[5]
    top, bottom, left, right = pad
    y = F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, stride=stride, groups=x.shape[1])
    y = ACT[act](y)
    if res == "full_add":
        y = y + r
    elif res == "channel_mul":
        y = y * r
    return y


class Prototypes(nn.Module):
    def forward(self, *xs):
        outs = []
        for i, cls in enumerate(CLASSES):
            x, w, b, r = xs[4 * i:4 * i + 4]
            p = cls[2] // 2
            outs.append(forward_class(cls, x, w, b, r, (p, p, p, p), (1, cls[3])))
        return tuple(outs)


def _proto_inputs():
    xs = []
    for _, dt, s, sw, _, res, in CLASSES:
        q = (16 + 2 * (s // 2) - s) // sw + 1
        r = {"none": torch.zeros(0), "full_add": torch.randn(2, 16, 16, q),
             "channel_mul": torch.randn(1, 16, 1, 1)}[res]
        xs += [torch.randn(2, 16, 16, 16).to(dt).contiguous(memory_format=torch.channels_last),
               torch.randn(16, 1, s, s).to(dt), torch.randn(16).to(dt), r.to(dt)]
    return tuple(xs)


@pytest.fixture(scope="module")
def prototypes():
    mods, _ = prototype_regions(Prototypes(), _proto_inputs(), len(CLASSES))
    assert {m.kernel.config.family for m in mods} == {"direct_depthwise"}
    return mods


@PROPERTY_SETTINGS
@given(data=st.data())
def test_random_depthwise_problems_match_float32_reference(prototypes, data):
    for cls, proto in zip(CLASSES, prototypes):
        name, dt, s, sw, _, res = cls
        c = 8 * data.draw(st.integers(1, 24), label=f"{name} C/8")
        n, h, w = (data.draw(st.integers(1, hi)) for hi in (3, 21, 25))
        r = data.draw(st.integers(1, 7), label=f"{name} R")
        pad = tuple(data.draw(st.integers(0, 3)) for _ in range(4))
        stride = (data.draw(st.integers(1, 3)), sw)
        try:
            problem = replace(proto.region.problem, c=c, k=c, groups=c, h=h, w=w, r=r, pad=pad,
                              stride=stride, n=n, n_hint=n)
        except ValueError:           # empty output
            assume(False)
        x = torch.randn(n, c, h, w, device="cuda").to(dt).contiguous(memory_format=torch.channels_last)
        wt = (torch.randn(c, 1, r, s, device="cuda") / (r * s) ** 0.5).to(dt)
        b = torch.randn(c, device="cuda").to(dt)
        mod = conv_region_module(proto, problem)
        check_conv_call(mod, f"{name} {problem}", x, wt, b, res, c,
                        lambda *t: forward_class(cls, *t, pad, stride))
        assert mod.fallback_calls == 0


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block (Liu et al. 2022): depthwise 7x7, LayerNorm over channels,
    pointwise MLP with GELU, layer scale, residual."""

    def __init__(self, dim=96):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pw1, self.pw2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.rand(dim))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class InvertedResidual(nn.Module):
    """EfficientNet's depthwise stage: a strided 3x3 depthwise conv, folded BatchNorm,
    in-place SiLU (timm's BatchNormAct2d)."""

    def __init__(self, c=32):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.bn.running_var.uniform_(0.5, 1.5)
        self.act = nn.SiLU(inplace=True)

    def forward(self, x):
        return self.act(self.bn(self.dw(x)))


@pytest.mark.parametrize("glue", ["eager", "inductor"])
@pytest.mark.parametrize("make, c", [(ConvNeXtBlock, 96), (InvertedResidual, 32)])
def test_depthwise_models_offload_and_match(make, c, glue):
    torch.manual_seed(0)
    m = make(c).eval().half().cuda().to(memory_format=torch.channels_last)
    x = torch.randn(4, c, 28, 28, device="cuda").half().contiguous(memory_format=torch.channels_last)
    compiled = co.compile(m, (x,), glue=glue, dynamic_batch=True)
    kinds = [k.config.family for k in compiled.plan.kernels]
    assert "direct_depthwise" in kinds, compiled.report.format()
    check_batches(compiled, m, lambda b: torch.randn(b, c, 28, 28, device="cuda").half().contiguous(
        memory_format=torch.channels_last), (4, 3))
