"""GPU property tests for the sm90a conv choices a search can pick beyond the rules
(select/conv.py ``search_space``, the learned conv table): the im2col lowering on
C % 8 == 0 (the pack's 16-byte path, the filter read in place as B), the same with
the GEMM split over K (stream-K scheduler, split-K), and TMA kernels without a cluster
(128 x 160 and 64 x 128 tiles). Each class is compiled once with its choice forced (select's
``tuned``), then random problem sizes and geometries run on its kernel (a conv
kernel takes every size at run time) against a float32 reference, outputs poisoned
first. CUTLASS_OFFLOAD_PROPERTY_EXAMPLES=N runs N random examples.
"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

from cutlass_offload.ir import ConvChoice, GemmLaunch, KernelConfig, replace
from helpers import check_conv_call, conv_operands, conv_region_module, property_settings

pytestmark = pytest.mark.gpu
PROPERTY_SETTINGS = property_settings()

_SK = dict(cluster=(1, 1, 1), kernel_schedule="KernelTmaWarpSpecializedCooperative",
           tile_scheduler="stream_k")
_TMA = dict(kernel_schedule="KernelImplicitTmaWarpSpecializedSm90",
            epilogue_schedule="TmaWarpSpecialized")
# (name, dtype, prototype C, K, residual, choice)
CLASSES = [
    ("im2col_c64_res", torch.float16, 64, 48, "full_add",
     ConvChoice("im2col", KernelConfig("cutlass3x_sm90", (64, 128, 64), 0, cluster=(1, 1, 1),
                                       kernel_schedule="KernelTmaWarpSpecializedPingpong"))),
    ("im2col_splitk_bf16", torch.bfloat16, 128, 64, "none",
     ConvChoice("im2col", KernelConfig("cutlass3x_sm90", (128, 64, 64), 0, **_SK),
                GemmLaunch(decomposition="split_k", splits=6))),
    ("im2col_splitk_res", torch.float16, 256, 128, "full_add",
     ConvChoice("im2col", KernelConfig("cutlass3x_sm90", (128, 128, 64), 0, **_SK),
                GemmLaunch(decomposition="split_k", splits=3))),
    ("tma_128x160", torch.float16, 32, 160, "full_add",
     ConvChoice("", KernelConfig("cutlass3x_sm90", (128, 160, 64), 0, cluster=(1, 1, 1), **_TMA))),
    ("tma_64x128_bf16", torch.bfloat16, 48, 32, "none",
     ConvChoice("", KernelConfig("cutlass3x_sm90", (64, 128, 64), 0, cluster=(1, 1, 1), **_TMA))),
]


def forward_class(res, x, w, b, r, pad, stride, dilation):
    top, bottom, left, right = pad
    y = F.relu(F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, stride=stride, dilation=dilation))
    return y + r if res == "full_add" else y


class Prototypes(torch.nn.Module):
    """One 3x3 'same' conv + bias + ReLU (+ residual) per class."""

    def forward(self, *xs):
        outs = []
        for i, cls in enumerate(CLASSES):
            x, w, b, r = xs[4 * i:4 * i + 4]
            outs.append(forward_class(cls[4], x, w, b, r, (1, 1, 1, 1), (1, 1), (1, 1)))
        return tuple(outs)


def _proto_inputs():
    xs = []
    for _, dt, c, k, res, _ in CLASSES:
        r = (torch.randn(2, k, 8, 8).contiguous(memory_format=torch.channels_last)
             if res == "full_add" else torch.zeros(0))
        xs += [torch.randn(2, c, 8, 8).to(dt).contiguous(memory_format=torch.channels_last),
               torch.randn(k, c, 3, 3).to(dt), torch.randn(k).to(dt), r.to(dt)]
    return tuple(xs)


@pytest.fixture(scope="module")
def prototypes():
    from cutlass_offload.api import compile_captured
    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions
    from cutlass_offload.partition import partition
    from cutlass_offload.select import conv_tuning_id
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a choices")
    options = CompileOptions(arch="sm90a", pytorch_when_faster=False)
    cap = capture(Prototypes(), _proto_inputs())
    by_ck = {(c, k): choice for _, _, c, k, _, choice in CLASSES}
    tuned = {conv_tuning_id(r.problem): by_ck[(r.problem.c, r.problem.k)]
             for r in partition(cap.graph_module, options).regions}
    assert len(tuned) == len(CLASSES)
    compiled = compile_captured(cap, options, tuned=tuned).to("cuda")
    mods = {(m.region.problem.c, m.region.problem.k): m for m in compiled.region_modules()}
    for name, _, c, k, _, choice in CLASSES:
        got = mods[(c, k)].kernel
        assert (got.iterator, got.config, got.launch) == (choice.iterator, choice.config,
                                                          choice.launch), name
    return [mods[(c, k)] for _, _, c, k, _, _ in CLASSES]


@PROPERTY_SETTINGS
@given(data=st.data())
def test_forced_choices_match_float32_reference(prototypes, data):
    from cutlass_offload.families import conv_sm90
    for (name, dt, _, _, res, choice), proto in zip(CLASSES, prototypes):
        c = 8 * data.draw(st.integers(1, 40), label=f"{name} C/8")
        k = 8 * data.draw(st.integers(1, 24), label=f"{name} K/8")
        n, h, w = (data.draw(st.integers(1, hi)) for hi in (3, 17, 19))
        r, s = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
        pad = tuple(data.draw(st.integers(0, 2)) for _ in range(4))
        stride = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
        dilation = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
        try:
            problem = replace(proto.region.problem, c=c, k=k, h=h, w=w, r=r, s=s, pad=pad,
                              stride=stride, dilation=dilation, n=n, n_hint=n)
        except ValueError:           # empty output
            assume(False)
        if not choice.iterator:
            assume(conv_sm90.supports(problem))
        x, wt, b = conv_operands(n, c, h, w, k, r, s, dt)
        check_conv_call(conv_region_module(proto, problem), f"{name} {problem}", x, wt, b, res, k,
                        lambda *t: forward_class(res, *t, pad, stride, dilation))


def test_deep_small_conv_split_k_matches_float32_reference(prototypes):
    """The case the split-K lowering is for (SD UNet: 8 x 8 x 2560 -> 1280, 3x3, batch
    2; here K = 128 channels out): a 23040-deep reduction split over the SMs."""
    (name, dt, _, _, res, _), proto = next((c, m) for c, m in zip(CLASSES, prototypes)
                                           if c[0] == "im2col_splitk_res")
    problem = replace(proto.region.problem, c=2560, k=128, h=8, w=8, n=2, n_hint=2)
    x = torch.randn(2, 2560, 8, 8, device="cuda").to(dt).contiguous(memory_format=torch.channels_last)
    wt = (torch.randn(128, 2560, 3, 3, device="cuda") / (2560 * 9) ** 0.5).to(dt)
    b = torch.randn(128, device="cuda").to(dt)
    check_conv_call(conv_region_module(proto, problem), name, x, wt, b, res, 128,
                    lambda *t: forward_class(res, *t, (1, 1, 1, 1), (1, 1), (1, 1)))
