"""Zero-padding a conv's input channels to a multiple of 8 so that an sm90a TMA
kernel runs it (ConvProblem.pad_c; no GPU: selection, and the region mapping on
CPU tensors, no launch), for 8 < C < 64; below 8 channels the conv is lowered onto
the sm90 GEMM through an explicit im2col instead, unpadded."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cutlass_offload.capture import capture
from cutlass_offload.ir import ConvProblem
from cutlass_offload.partition import partition
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.select import select
from cutlass_offload.select.conv import PAD_C_BELOW, pad_channels

H = torch.float16


class Conv(nn.Module):
    def __init__(self, c, k, r, stride, pad):
        super().__init__()
        self.conv = nn.Conv2d(c, k, r, stride=stride, padding=pad)

    def forward(self, x):
        return torch.relu(self.conv(x))


STEM = {"c": 3, "k": 64, "r": 7, "stride": 2, "pad": 3, "hw": 32}      # ResNet-50's stem (smaller image)
CONV_IN = {"c": 4, "k": 320, "r": 3, "stride": 1, "pad": 1, "hw": 16}  # the SD UNet's conv_in
ODD_STEM = {"c": 9, "k": 64, "r": 7, "stride": 2, "pad": 3, "hw": 32}  # padded to 16 channels
ODD = {"c": 12, "k": 320, "r": 3, "stride": 1, "pad": 1, "hw": 16}


def compiled_region(case, arch, dtype=H):
    torch.manual_seed(0)
    m = Conv(case["c"], case["k"], case["r"], case["stride"], case["pad"]).to(dtype)
    m = m.to(memory_format=torch.channels_last)
    x = torch.randn(2, case["c"], case["hw"], case["hw"], dtype=dtype).contiguous(
        memory_format=torch.channels_last)
    cap = capture(m, (x,))
    plan = select(partition(cap.graph_module), arch)
    return m, x, plan


@pytest.mark.parametrize("case", [ODD_STEM, ODD], ids=["c9_stem", "c12"])
def test_sm90a_pads_c_and_takes_the_tma_kernel(case):
    _, _, plan = compiled_region(case, "sm90a")
    (region,), (kernel,) = plan.regions, plan.kernels
    p = region.problem
    assert p.c == case["c"] and p.c_kernel == 16 and p.pad_c == 16 - case["c"]
    assert kernel.config.family == "cutlass3x_sm90" and not kernel.iterator
    assert (kernel.align_a, kernel.align_b, kernel.align_c) == (8, 8, 8)


@pytest.mark.parametrize("case", [STEM, CONV_IN], ids=["stem", "conv_in"])
def test_sm90a_lowers_few_channels_onto_the_gemm_unpadded(case):
    _, _, plan = compiled_region(case, "sm90a")
    (region,), (kernel,) = plan.regions, plan.kernels
    assert region.problem.pad_c == 0 and region.problem.c_kernel == case["c"]
    assert kernel.config.family == "cutlass3x_sm90" and kernel.iterator == "im2col"
    assert kernel.align_a == (1 if case["c"] == 3 else 4) and kernel.align_c == 8


@pytest.mark.parametrize("case", [STEM, CONV_IN], ids=["stem", "conv_in"])
def test_sm80_keeps_the_2x_kernel_unpadded(case):
    _, _, plan = compiled_region(case, "sm80")
    (region,), (kernel,) = plan.regions, plan.kernels
    assert region.problem.pad_c == 0 and region.problem.c_kernel == case["c"]
    assert kernel.config.family != "cutlass3x_sm90" and kernel.iterator
    assert kernel.align_a == (1 if case["c"] == 3 else 4)


def _problem(**kw):
    fields = {"c": 11, "k": 64, "h": 32, "w": 32, "r": 7, "s": 7, "dtype": "f16", "align_a": 1,
              "align_b": 1, "align_c": 8, "pad": (3, 3, 3, 3), "stride": (2, 2)}
    return ConvProblem(**{**fields, **kw})


def test_pad_channels_only_where_it_lets_tma_run():
    assert pad_channels(_problem(), "sm90a").pad_c == 5
    assert pad_channels(_problem(dtype="bf16"), "sm90a").pad_c == 5
    assert pad_channels(_problem(c=9), "sm90a").c_kernel == 16
    assert pad_channels(_problem(c=3), "sm90a").pad_c == 0            # the im2col lowering's
    assert pad_channels(_problem(), "sm80").pad_c == 0
    assert pad_channels(_problem(k=20, align_c=4), "sm90a").pad_c == 0              # K % 8
    assert pad_channels(_problem(c=8, align_a=8, align_b=8), "sm90a").pad_c == 0    # no need
    assert pad_channels(_problem(c=PAD_C_BELOW + 2, align_a=2, align_b=2), "sm90a").pad_c == 0
    assert pad_channels(_problem(stride=(9, 9), h=300, w=300), "sm90a").pad_c == 0  # TMA limit
    assert pad_channels(_problem(dtype="f32", tf32=True), "sm90a").pad_c == 0
    # a squeeze-excite expand conv (1x1 image): its 2.x kernel reads C as it is
    se = _problem(c=20, k=480, r=1, s=1, pad=(0, 0, 0, 0), stride=(1, 1), h=1, w=1, align_a=4, align_b=4)
    assert pad_channels(se, "sm90a").pad_c == 0
    assert pad_channels(dataclasses.replace(se, h=2, w=2), "sm90a").pad_c == 4
    with pytest.raises(ValueError, match="pad_c"):
        dataclasses.replace(_problem(), pad_c=-1)


def _module(case, arch="sm90a"):
    m, x, plan = compiled_region(case, arch)
    cap = capture(m, (x,))
    gm = offload(cap.graph_module, plan, library_path=None)
    (mod,) = [t for t in gm.modules() if type(t).__name__ == "ConvRegionModule"]
    return m, x, mod


def _call(mod, x, w, b):
    xs = [None] * 3
    xs[mod._ix], xs[mod._iw], xs[mod._ibias] = x, w, b
    return mod._map(tuple(xs))


@pytest.mark.parametrize("case", [ODD_STEM, ODD], ids=["c9_stem", "c12"])
def test_mapping_pads_input_and_filter_with_zeros(case):
    m, x, mod = _module(case)
    assert mod.filter_constant
    w = m.conv.weight.detach().contiguous(memory_format=torch.channels_last)
    b = m.conv.bias.detach()
    out, args, keep = _call(mod, x, w, b)
    xp, wp = keep[0], keep[1]
    c = case["c"]
    assert xp.shape == (2, case["hw"], case["hw"], 16) and xp.is_contiguous()
    assert torch.equal(xp[..., :c], x.permute(0, 2, 3, 1)) and not xp[..., c:].any()
    assert wp.shape == (case["k"], case["r"], case["r"], 16) and wp.is_contiguous()
    assert torch.equal(wp[..., :c], w.permute(0, 2, 3, 1)) and not wp[..., c:].any()
    assert args.c == 16 and args.x == xp.data_ptr() and args.filter == wp.data_ptr()
    assert (args.n, args.k, args.p, args.q) == (2, case["k"], out.shape[2], out.shape[3])
    assert args.bias == b.data_ptr()
    # the padded operands compute the same conv (zero channels add nothing)
    ref = F.conv2d(x.float(), w.float(), stride=case["stride"], padding=case["pad"])
    got = F.conv2d(xp.permute(0, 3, 1, 2).float(), wp.permute(0, 3, 1, 2).float(),
                   stride=case["stride"], padding=case["pad"])
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)
    assert mod.channel_pad_copies == 2 and mod.layout_conversions == 0


def test_constant_filter_is_padded_once_until_it_changes():
    m, x, mod = _module(ODD_STEM)
    w = m.conv.weight.detach().contiguous(memory_format=torch.channels_last)
    b = m.conv.bias.detach()
    first = _call(mod, x, w, b)[2][1]
    c = ODD_STEM["c"]
    for _ in range(2):                  # new input copy per call, the same filter
        again = _call(mod, x.clone(memory_format=torch.channels_last), w, b)
        assert again[2][1] is first and again[1].filter == first.data_ptr()
    assert mod.channel_pad_copies == 1 + 3
    assert not mod._direct              # a copied input never takes the cached path
    with torch.no_grad():
        w.mul_(2)                       # in place: the version counter moves on
    changed = _call(mod, x, w, b)[2][1]
    assert changed is not first and torch.equal(changed[..., :c], w.permute(0, 2, 3, 1))
    assert mod.channel_pad_copies == 4 + 2


def test_non_constant_filter_is_padded_every_call():
    m, x, mod = _module(ODD_STEM)
    mod.filter_constant = False         # as for a weight that is a graph input
    w = m.conv.weight.detach().contiguous(memory_format=torch.channels_last)
    b = m.conv.bias.detach()
    a, c = _call(mod, x, w, b), _call(mod, x, w, b)
    assert a[2][1] is not c[2][1] and torch.equal(a[2][1], c[2][1])
    assert mod.channel_pad_copies == 4


def test_call_that_does_not_fit_is_refused():
    m, x, mod = _module(ODD_STEM)
    w = m.conv.weight.detach()
    b = m.conv.bias.detach()
    assert _call(mod, torch.randn(2, 16, 32, 32, dtype=H), w, b) is None    # C' channels given
    assert _call(mod, x.float(), w, b) is None
    assert mod.channel_pad_copies == 0


SE_EXPAND = {"c": 20, "k": 480, "r": 1, "stride": 1, "pad": 0, "hw": 1}   # EfficientNet's squeeze-excite


def test_a_1x1_image_conv_reads_its_channels_in_place():
    """A squeeze-excite expand conv (20 channels on a 1x1 image) keeps C unpadded on a
    2.x kernel: a call reads the input and filter where they are (no copy), so its
    signature takes the cached path (and the op's C++ replay)."""
    m, x, mod = _module(SE_EXPAND)
    p = mod.region.problem
    assert p.pad_c == 0 and mod.kernel.config.family != "cutlass3x_sm90" and mod.kernel.align_a == 4
    w = m.conv.weight.detach().contiguous(memory_format=torch.channels_last)
    b = m.conv.bias.detach()
    for _ in range(2):
        out, args, keep = _call(mod, x, w, b)
        assert args.x == x.data_ptr() and args.filter == w.data_ptr() and args.c == 20
        assert out.shape == (2, 480, 1, 1)
    assert mod.channel_pad_copies == 0 and mod.layout_conversions == 0 and len(mod._direct) == 1
