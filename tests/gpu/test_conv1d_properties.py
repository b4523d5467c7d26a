"""GPU property tests (hypothesis) for conv1d: random 1-D problems on the conv2d
kernels that a conv1d is lifted onto (partition/lift_1d.py: (N, C, L) as
(N, C, 1, L), a (K, C/g, S) filter as (K, C/g, 1, S)).

Prototype conv1d modules (Whisper's stem convs, an odd K, a few-channel input, two
depthwise conv1d) are compiled once; each drawn problem (N, C, K, L, filter width,
symmetric padding, stride, dilation, values) then runs on its prototype's kernel
through a ConvRegionModule bound to the same library symbol, with x as the lifted
graph hands it over: the unsqueezed (N, C, L) view, or channels_last as a previous
conv region writes it. Outputs are poisoned first and compared with F.conv1d in
float32. By default a derandomized subset runs; CUTLASS_OFFLOAD_PROPERTY_EXAMPLES=N
runs N random examples (each covers every class).
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

from cutlass_offload.ir import replace
from helpers import check_conv_call, conv_region_module, property_settings, prototype_regions

pytestmark = pytest.mark.gpu
PROPERTY_SETTINGS = property_settings()

ACT = {"relu": torch.relu, "silu": F.silu, "gelu": F.gelu, "none": lambda y: y}
# (name, dtype, prototype C, K, filter width S, stride, act, depthwise)
CLASSES = [
    ("whisper_conv1_gelu", torch.float16, 80, 128, 3, 1, "gelu", False),
    ("whisper_conv2_bf16_s2", torch.bfloat16, 64, 64, 3, 2, "gelu", False),
    ("k_odd_relu", torch.float16, 12, 21, 5, 1, "relu", False),
    ("few_channels_silu", torch.float16, 4, 32, 7, 1, "silu", False),
    ("dw5_silu", torch.float16, 32, 32, 5, 1, "silu", True),
    ("dw3_s2_bf16", torch.bfloat16, 32, 32, 3, 2, "none", True),
]


def conv1d_class(cls, x, w, b, padding, stride, dilation):
    """The class's conv1d + activation on (N, C, L) x and a (K, C/g, S) filter."""
    groups = x.shape[1] if cls[7] else 1
    return ACT[cls[6]](F.conv1d(x, w, b, stride=stride, padding=padding, dilation=dilation,
                                groups=groups))


class Prototypes(nn.Module):
    def forward(self, *xs):
        return tuple(conv1d_class(cls, *xs[3 * i:3 * i + 3], cls[4] // 2, cls[5], 1)
                     for i, cls in enumerate(CLASSES))


def _proto_inputs():
    xs = []
    for _, dt, c, k, s, _, _, dw in CLASSES:
        xs += [torch.randn(2, c, 64).to(dt), torch.randn(k, 1 if dw else c, s).to(dt),
               torch.randn(k).to(dt)]
    return tuple(xs)


@pytest.fixture(scope="module")
def prototypes():
    mods, _ = prototype_regions(Prototypes(), _proto_inputs(), len(CLASSES))
    assert all(m.region.problem.h == 1 and m.region.problem.r == 1 for m in mods)
    return mods


def draw_problem(data, cls, proto):
    """(problem over a height of 1, padding, stride, dilation) for ``proto``: C and K
    multiples of its kernel's alignments (any C below 64 for a class whose C is
    zero-padded to 8s); a depthwise class keeps its filter width and stride (compile-time
    in its kernel) and takes C = K a multiple of 8, dilation 1."""
    from cutlass_offload.emit import conv_sm90
    name, kern, base = cls[0], proto.kernel, proto.region.problem
    n = data.draw(st.integers(1, 3), label=f"{name} N")
    length = data.draw(st.integers(1, 300), label=f"{name} L")
    if cls[7]:
        c = k = 8 * data.draw(st.integers(1, 24), label=f"{name} C/8")
        s, stride, dilation = cls[4], cls[5], 1
        pad = data.draw(st.integers(0, cls[4] // 2 + 1), label=f"{name} pad")
        kw = {"groups": c}
    else:
        if base.pad_c > 0:
            c = data.draw(st.integers(1, 63).filter(lambda v: v % 8), label=f"{name} C")
        else:
            c = kern.align_a * data.draw(st.integers(1, 96 // kern.align_a), label=f"{name} C/align")
        k = kern.align_c * data.draw(st.integers(1, 96 // kern.align_c), label=f"{name} K/align")
        s = data.draw(st.integers(1, 9), label=f"{name} S")
        pad = data.draw(st.integers(0, 4), label=f"{name} pad")
        stride = data.draw(st.integers(1, 3), label=f"{name} stride")
        dilation = data.draw(st.integers(1, 3), label=f"{name} dilation")
        kw = {"pad_c": -c % 8 if base.pad_c > 0 else 0}
    try:
        problem = replace(base, n=n, n_hint=n, c=c, k=k, h=1, w=length, r=1, s=s,
                          pad=(0, 0, pad, pad), stride=(1, stride), dilation=(1, dilation), **kw)
    except ValueError:           # empty output
        assume(False)
    if kern.config.family == "cutlass3x_sm90" and not kern.iterator:
        assume(conv_sm90.supports(problem))
    return problem, pad, stride, dilation


@PROPERTY_SETTINGS
@given(data=st.data())
def test_random_conv1d_problems_match_float32_reference(prototypes, data):
    for cls, proto in zip(CLASSES, prototypes):
        name, dt = cls[0], cls[1]
        problem, pad, stride, dilation = draw_problem(data, cls, proto)
        n, c, k, length, s = problem.n, problem.c, problem.k, problem.w, problem.s
        x1 = torch.randn(n, c, length, device="cuda").to(dt)
        x = x1.unsqueeze(2)                          # as the lifted graph passes it
        if data.draw(st.booleans(), label=f"{name} channels_last x"):
            x = x.contiguous(memory_format=torch.channels_last)
        cin = 1 if cls[7] else c
        wt = (torch.randn(k, cin, 1, s, device="cuda") / (cin * s) ** 0.5).to(dt)
        b = torch.randn(k, device="cuda").to(dt)
        mod = conv_region_module(proto, problem)
        check_conv_call(mod, f"{name} {problem}", x, wt, b, "none", k,
                        lambda xf, wf, bf, _: conv1d_class(cls, xf.squeeze(2), wf.squeeze(2), bf,
                                                           pad, stride, dilation).unsqueeze(2))
        assert mod.fallback_calls == 0, f"{name} {problem} ran PyTorch"
