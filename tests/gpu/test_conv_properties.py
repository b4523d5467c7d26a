"""GPU property tests (hypothesis) for conv2d kernels: random problem sizes, padding
(asymmetric), stride, dilation and values on a fixed set of compiled kernel classes,
each against a float32 reference.

A conv kernel takes every size at run time, so one library built from prototype
regions serves any problem of the same class (dtype, alignments, epilogue):
hypothesis draws N, C, H, W, K, R, S, padding, stride and dilation freely (C and
K multiples of the class's alignments) and runs the prototype's kernel on them
through a ConvRegionModule bound to the same library symbol. By default a
derandomized subset runs; CUTLASS_OFFLOAD_PROPERTY_EXAMPLES=500 runs that many
random ones. A failure found here becomes a case in conv_cases.py.
"""
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cutlass_offload as co
from cutlass_offload.emit import conv_sm90
from cutlass_offload.ir import ConvProblem, replace
from cutlass_offload.runtime.conv_region import ConvRegionModule
from helpers import TOLERANCE, poison_allocator, rel_err

pytestmark = pytest.mark.gpu
_DEEP = int(os.environ.get("CUTLASS_OFFLOAD_PROPERTY_EXAMPLES", "0"))
PROPERTY_SETTINGS = settings(max_examples=_DEEP or 25, derandomize=not _DEEP, deadline=None,
                             suppress_health_check=[HealthCheck.function_scoped_fixture])

ACT = {"relu": torch.relu, "silu": F.silu, "gelu": F.gelu, "none": lambda y: y}
# (name, dtype, prototype C, K, act, residual: none | full_add | channel_mul)
CLASSES = [
    ("tma_relu", torch.float16, 32, 64, "relu", "none"),
    ("tma_bf16_silu_res", torch.bfloat16, 16, 32, "silu", "full_add"),
    ("tma_vec_mul", torch.float16, 24, 40, "relu", "channel_mul"),
    ("sm80_c_odd", torch.float16, 3, 16, "none", "none"),
    ("sm80_k_odd_gelu", torch.float16, 12, 21, "gelu", "none"),
    ("sm80_bf16_align2", torch.bfloat16, 6, 10, "relu", "full_add"),
]


def forward_class(cls, x, w, b, r, pad, stride, dilation):
    _, _, _, _, act, res = cls
    top, bottom, left, right = pad
    y = F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, stride=stride, dilation=dilation)
    y = ACT[act](y)
    if res == "full_add":
        y = y + r
    elif res == "channel_mul":
        y = y * r
    return y


class Prototypes(torch.nn.Module):
    """One conv region per class, 3x3 padding 1 stride 1 (the sizes don't matter)."""

    def forward(self, *xs):
        outs = []
        for i, cls in enumerate(CLASSES):
            x, w, b, r = xs[4 * i:4 * i + 4]
            outs.append(forward_class(cls, x, w, b, r, (1, 1, 1, 1), (1, 1), (1, 1)))
        return tuple(outs)


def _proto_inputs():
    xs = []
    for _, dt, c, k, _, res in CLASSES:
        r = {"none": torch.zeros(0), "full_add": torch.randn(2, k, 8, 8),
             "channel_mul": torch.randn(1, k, 1, 1)}[res]
        xs += [torch.randn(2, c, 8, 8).to(dt).contiguous(memory_format=torch.channels_last),
               torch.randn(k, c, 3, 3).to(dt), torch.randn(k).to(dt), r.to(dt)]
    return tuple(xs)


@pytest.fixture(scope="module")
def prototypes():
    compiled = co.compile(Prototypes(), _proto_inputs()).to("cuda")
    mods = compiled.region_modules()
    assert len(mods) == len(CLASSES), compiled.report.format()
    families = {m.kernel.config.family for m in mods}
    assert families == {"cutlass3x_sm90", "cutlass2x_sm80"} or compiled.plan.arch == "sm80"
    return mods


def _module(proto: ConvRegionModule, problem: ConvProblem) -> ConvRegionModule:
    region = replace(proto.region, problem=problem)
    roles = {"x": 0, "w": 1, "bias": 2}
    if proto.region.c is not None:
        roles["c"] = 3
    return ConvRegionModule(region, proto.kernel, _refused, roles, proto._library_getter)


def _refused(*xs):
    raise AssertionError("the kernel refused a problem of its class (can_implement failed)")


@PROPERTY_SETTINGS
@given(data=st.data())
def test_random_conv_problems_match_float32_reference(prototypes, data):
    for cls, proto in zip(CLASSES, prototypes):
        name, dt, _, _, _, res = cls
        kern = proto.kernel
        padded = proto.region.problem.pad_c > 0    # sm80_c_odd on sm90a: C zero-padded to 8s
        if padded:                                 # (select.conv.pad_channels: C < 64, C % 8)
            c = data.draw(st.integers(1, 63).filter(lambda v: v % 8), label=f"{name} C")
        else:
            c = kern.align_a * data.draw(st.integers(1, 64 // kern.align_a), label=f"{name} C/align")
        k = kern.align_c * data.draw(st.integers(1, 96 // kern.align_c), label=f"{name} K/align")
        n, h, w = (data.draw(st.integers(1, hi)) for hi in (3, 19, 23))
        r, s = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5))
        pad = tuple(data.draw(st.integers(0, 3)) for _ in range(4))
        stride = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
        dilation = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
        try:
            problem = replace(proto.region.problem, c=c, k=k, h=h, w=w, r=r, s=s, pad=pad,
                              stride=stride, dilation=dilation, n=n, n_hint=n,
                              pad_c=-c % 8 if padded else 0)
        except ValueError:           # empty output
            assume(False)
        if kern.config.family == "cutlass3x_sm90":    # else the pipeline picks a 2.x kernel
            assume(conv_sm90.supports(problem))
        x = torch.randn(n, c, h, w, device="cuda").to(dt).contiguous(memory_format=torch.channels_last)
        wt = (torch.randn(k, c, r, s, device="cuda") / (c * r * s) ** 0.5).to(dt)
        b = torch.randn(k, device="cuda").to(dt)
        rr = {"none": None, "full_add": torch.randn(n, k, problem.p, problem.q, device="cuda"),
              "channel_mul": torch.randn(1, k, 1, 1, device="cuda")}[res]
        xs = (x, wt, b) + ((rr.to(dt).contiguous(memory_format=torch.channels_last),) if rr is not None else ())
        mod = _module(proto, problem)
        assert mod._map(xs) is not None, f"{name}: {problem} does not map onto {kern.name}"
        poison_allocator()
        with torch.no_grad():
            out = mod(*xs)
        torch.cuda.synchronize()
        ref = forward_class(cls, x.float(), wt.float(), b.float(),
                            xs[3].float() if rr is not None else None, pad, stride, dilation)
        assert not out.isnan().any(), f"{name} {problem}: unwritten output"
        err = rel_err(out, ref)
        assert err < TOLERANCE[dt], f"{name} {problem}: rel. error {err:.2e}"
