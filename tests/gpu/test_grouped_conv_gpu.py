"""GPU: grouped conv2d regions (channel groups, not depthwise) on CUTLASS 2.x's
grouped fprop kernels (families/grouped_conv.py), written without a GPU in session 31;
off by default until this file passes (CUTLASS_OFFLOAD_GROUPED_CONV=1 here).

Property tests as in test_depthwise_kernel.py: one library built from prototype
regions, one per kernel class (dtype, groups, iterator, tile, activation); the group
count is compiled in, every other size is a run-time argument, so hypothesis draws
N, H, W, R, S, padding (asymmetric), stride, dilation and the channels per group
(K / groups a multiple of the tile's N) and runs the class's kernel on them against
a float32 reference, outputs poisoned first. CUTLASS_OFFLOAD_PROPERTY_EXAMPLES=100 runs 100
random problems per class (5 classes: 500 problems). Then a ResNeXt block under eager
and Inductor glue, at a second batch size.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import cutlass_offload as co
from cutlass_offload.ir import replace
from helpers import check_batches, check_conv_call, conv_region_module, property_settings

pytestmark = pytest.mark.gpu
PROPERTY_SETTINGS = property_settings()

ACT = {"relu": torch.relu, "silu": F.silu, "none": lambda y: y}
# (name, dtype, groups, C / groups, K / groups of the prototype, act, mode, iterator,
#  the prototype's image side: it sets the tile select picks, 128 x 64 / 64 x 64 /
#  128 x 32 / 64 x 32). Session 32 ran two classes of CUTLASS's multiple-group mode
#  (64 x 16 tiles) here: wrong rows, so families/grouped_conv.py no longer takes it.
CLASSES = [
    ("g4_cg32_single_opt", torch.float16, 4, 32, 64, "relu", "single", "optimized", 56),
    ("g8_cg24_kg32_an", torch.float16, 8, 24, 32, "none", "single", "analytic", 12),
    ("g2_cg24_single_an", torch.bfloat16, 2, 24, 128, "silu", "single", "analytic", 28),
    ("g4_cg32_kg32_opt", torch.float16, 4, 32, 32, "relu", "single", "optimized", 40),
    ("g4_cg64_bf16", torch.bfloat16, 4, 64, 64, "none", "single", "optimized", 40),
]


@pytest.fixture(autouse=True)
def grouped_on(monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_GROUPED_CONV", "1")


def forward_class(cls, x, w, b, pad, stride, dilation):
    top, bottom, left, right = pad
    y = F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, stride=stride, dilation=dilation,
                 groups=cls[2])
    return ACT[cls[5]](y)


class Prototypes(nn.Module):
    def forward(self, *xs):
        return tuple(forward_class(cls, xs[3 * i], xs[3 * i + 1], xs[3 * i + 2], (1, 1, 1, 1),
                                   (1, 1), (1, 1))
                     for i, cls in enumerate(CLASSES))


def _proto_inputs():
    xs = []
    for _, dt, g, c_g, k_g, *_, side in CLASSES:
        xs += [torch.randn(2, g * c_g, side, side).to(dt).contiguous(memory_format=torch.channels_last),
               torch.randn(g * k_g, c_g, 3, 3).to(dt), torch.randn(g * k_g).to(dt)]
    return tuple(xs)


@pytest.fixture(scope="module")
def prototypes():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUTLASS_OFFLOAD_GROUPED_CONV", "1")
        compiled = co.compile(Prototypes(), _proto_inputs()).to("cuda")
    mods = compiled.region_modules()
    assert len(mods) == len(CLASSES), compiled.report.format()
    for cls, m in zip(CLASSES, mods):
        k = m.kernel
        assert (k.groups, k.group_mode, k.iterator) == (cls[2], cls[6], cls[7]), (cls[0], k.name)
    return mods


@pytest.mark.parametrize("index", range(len(CLASSES)), ids=[c[0] for c in CLASSES])
@PROPERTY_SETTINGS
@given(data=st.data())
def test_random_grouped_problems_match_float32_reference(prototypes, index, data):
    cls, proto = CLASSES[index], prototypes[index]
    name, dt, g, _, _, _, _, iterator, _ = cls
    tile_n = proto.kernel.config.tile[1]
    # single-group mode: K / groups a multiple of the tile's N
    k_g = tile_n * data.draw(st.integers(1, max(1, 256 // tile_n)), label=f"{name} K_g/N")
    # the optimized iterator runs whole 32-channel K tiles (families/grouped_conv.py)
    step = 32 if iterator == "optimized" else proto.kernel.align_a
    c_g = step * data.draw(st.integers(1, max(1, 96 // step)), label=f"{name} C_g")
    r, s = data.draw(st.integers(1, 5), label="R"), data.draw(st.integers(1, 5), label="S")
    pad = tuple(data.draw(st.integers(0, 2)) for _ in range(4))
    stride = tuple(data.draw(st.integers(1, 2)) for _ in range(2))
    dilation = tuple(data.draw(st.integers(1, 2)) for _ in range(2))
    # the image at least as large as the dilated filter over the padding: no empty output
    min_h = max(1, dilation[0] * (r - 1) + 1 - pad[0] - pad[1])
    min_w = max(1, dilation[1] * (s - 1) + 1 - pad[2] - pad[3])
    n = data.draw(st.integers(1, 3), label="N")
    h = data.draw(st.integers(min_h, min_h + 16), label="H")
    w = data.draw(st.integers(min_w, min_w + 18), label="W")
    problem = replace(proto.region.problem, c=g * c_g, k=g * k_g, h=h, w=w, r=r, s=s,
                      pad=pad, stride=stride, dilation=dilation, n=n, n_hint=n)
    x = torch.randn(n, g * c_g, h, w, device="cuda").to(dt).contiguous(
        memory_format=torch.channels_last)
    wt = (torch.randn(g * k_g, c_g, r, s, device="cuda") / (c_g * r * s) ** 0.5).to(dt)
    b = torch.randn(g * k_g, device="cuda").to(dt)
    mod = conv_region_module(proto, problem)
    check_conv_call(mod, f"{name} {problem}", x, wt, b, "none", g * k_g,
                    lambda x_, w_, b_, r_: forward_class(cls, x_, w_, b_, pad, stride, dilation))
    assert mod.fallback_calls == 0


class ResNeXtBlock(nn.Module):
    """ResNeXt's bottleneck (Xie et al. 2017): 1x1 reduce, 3x3 grouped conv (32
    groups), 1x1 expand, folded BatchNorms, ReLU, residual."""

    def __init__(self, c=256, width=128, groups=32):
        super().__init__()
        self.conv1 = nn.Conv2d(c, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)
        for bn in (self.bn1, self.bn2, self.bn3):
            bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        return torch.relu(x + self.bn3(self.conv3(y)))


@pytest.mark.parametrize("glue", ["eager", "inductor"])
def test_resnext_block_offloads_its_grouped_conv_and_matches(glue):
    """32 channels per group (ResNeXt-50 32x4d's last stage: 1024 in 32 groups); the
    first stage's 4 per group would do 8x the useful MMA work and stay in PyTorch."""
    torch.manual_seed(0)
    m = ResNeXtBlock(c=256, width=256, groups=8).eval().half().cuda().to(
        memory_format=torch.channels_last)
    x = torch.randn(4, 256, 14, 14, device="cuda").half().contiguous(memory_format=torch.channels_last)
    compiled = co.compile(m, (x,), glue=glue, dynamic_batch=True)
    grouped = [k for k in compiled.plan.kernels if getattr(k, "groups", 1) != 1]
    assert len(grouped) == 1, compiled.report.format()
    check_batches(compiled, m, lambda b: torch.randn(b, 256, 14, 14, device="cuda").half().contiguous(
        memory_format=torch.channels_last), (4, 3))
