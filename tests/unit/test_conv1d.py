"""1-D forms lifted to 2-D (partition/lift_1d.py; no GPU): conv1d as a conv2d (the rewrite
computes what conv1d does for every argument form, the regions it makes fuse the
activation after the conv, a conv1d chain reads the previous region's output
directly, and forms it does not take are left alone."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.partition import partition

aten = torch.ops.aten


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("kw", [
    dict(kernel_size=3, padding=1), dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=5, padding="same", dilation=2), dict(kernel_size=4, padding="valid", bias=False),
    dict(kernel_size=3, padding=2, groups=4), dict(kernel_size=7, padding=3, groups=16, stride=3),
])
def test_rewrite_computes_conv1d(kw):
    torch.manual_seed(0)
    m = nn.Conv1d(16, 32 if kw.get("groups", 1) != 16 else 16, **kw).eval()
    x = torch.randn(3, 16, 29)
    gm = capture(m, (x,), dynamic_batch=True).graph_module
    t = targets(gm)
    assert aten.conv1d.default not in t and aten.conv1d.padding not in t
    assert aten.conv2d.default in t or aten.conv2d.padding in t
    with torch.no_grad():
        for xn in (x, torch.randn(5, 16, 29)):
            torch.testing.assert_close(gm(xn), m(xn), rtol=1e-5, atol=1e-5)


class WhisperStem(nn.Module):
    """Whisper's encoder stem: conv1d + GELU, a strided conv1d + GELU, to (N, L, D)."""

    def __init__(self, mels=80, d=64):
        super().__init__()
        self.conv1 = nn.Conv1d(mels, d, 3, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)

    def forward(self, x):
        x = F.gelu(self.conv1(x))
        x = F.gelu(self.conv2(x))
        return x.permute(0, 2, 1)


def test_whisper_stem_becomes_two_conv_regions_with_gelu():
    m = WhisperStem().half().eval()
    x = torch.randn(2, 80, 60, dtype=torch.float16)
    gm = capture(m, (x,), dynamic_batch=True).graph_module
    # the second conv reads the first one's GELU (no squeeze / unsqueeze between)
    convs = [n for n in gm.graph.nodes if n.target is aten.conv2d.default]
    assert convs[1].args[0].target is aten.gelu.default and convs[1].args[0].args[0] is convs[0]
    part = partition(gm, CompileOptions(arch="sm90a"))
    assert [r.problem.epilogue.tag for r in part.regions] == ["bias_gelu", "bias_gelu"]
    assert [(r.problem.h, r.problem.r, r.problem.s, r.problem.stride) for r in part.regions] == \
        [(1, 1, 3, (1, 1)), (1, 1, 3, (1, 2))]
    assert not part.fallbacks


def test_depthwise_conv1d_is_a_depthwise_region():
    m = nn.Conv1d(32, 32, 5, padding=2, groups=32).half().eval()
    part = partition(capture(m, (torch.randn(2, 32, 40, dtype=torch.float16),)).graph_module)
    (r,) = part.regions
    assert r.problem.depthwise and (r.problem.h, r.problem.r, r.problem.s) == (1, 1, 5)


def test_filter_given_as_an_input_is_unsqueezed_in_the_graph():
    class M(nn.Module):
        def forward(self, x, w):
            return F.relu(F.conv1d(x, w, padding=1))
    x, w = torch.randn(2, 8, 20), torch.randn(16, 8, 3)
    gm = capture(M(), (x, w)).graph_module
    assert sum(n.target is aten.unsqueeze.default for n in gm.graph.nodes) == 2
    torch.testing.assert_close(gm(x, w), F.relu(F.conv1d(x, w, padding=1)))


def test_unbatched_conv1d_and_a_shared_output_stay_as_they_are():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv1d(8, 8, 3, padding=1)

        def forward(self, x, y):
            z = self.c(y)                  # read twice: the squeeze stays above both
            return self.c(x), F.gelu(z) + z
    x, y = torch.randn(8, 20), torch.randn(2, 8, 20)
    m = M().eval()
    gm = capture(m, (x, y)).graph_module
    t = targets(gm)
    assert aten.conv1d.default in t                     # the unbatched one
    assert aten.squeeze.dim in t
    with torch.no_grad():
        for a, b in zip(gm(x, y), m(x, y)):
            torch.testing.assert_close(a, b)


class TokenGroupNorm(nn.Module):
    """diffusers' Attention group norm on (B, HW, C) tokens: group_norm(x^T) then SiLU."""

    def __init__(self, c=64, groups=8):
        super().__init__()
        self.gn = nn.GroupNorm(groups, c)

    def forward(self, x):
        return F.silu(self.gn(x.transpose(1, 2))).transpose(1, 2) * 2


def test_group_norm_on_a_3d_input_is_a_4d_region_with_its_silu():
    torch.manual_seed(0)
    m = TokenGroupNorm().eval()
    x = torch.randn(2, 48, 64)
    gm = capture(m, (x,), dynamic_batch=True).graph_module
    with torch.no_grad():
        for xn in (x, torch.randn(3, 48, 64)):
            torch.testing.assert_close(gm(xn), m(xn), rtol=1e-5, atol=1e-5)
    (r,) = partition(gm, CompileOptions(arch="sm90a")).regions
    assert r.form == "group_norm" and (r.problem.c, r.problem.h, r.problem.w) == (64, 1, 48)
    assert r.problem.silu and r.problem.n is None
