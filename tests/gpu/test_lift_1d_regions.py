"""GPU: 1-D forms lifted to 2-D (partition/lift_1d.py). Whisper's encoder stem and a
depthwise conv1d (conv2d regions over a height of 1), and the VAE attention's 3-D
group norm, run offloaded under eager and Inductor glue and match a float32
reference at two batch sizes."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cutlass_offload as co
from helpers import check_batches

pytestmark = pytest.mark.gpu


class Stem(nn.Module):
    def __init__(self, mels=80, d=128):
        super().__init__()
        self.conv1 = nn.Conv1d(mels, d, 3, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        self.dw = nn.Conv1d(d, d, 5, padding=2, groups=d)

    def forward(self, x):
        x = F.gelu(self.conv1(x))
        x = F.gelu(self.conv2(x))
        return F.silu(self.dw(x)).permute(0, 2, 1)


@pytest.mark.parametrize("glue", ["eager", "inductor"])
def test_conv1d_stem_offloads_and_matches(glue):
    torch.manual_seed(0)
    m = Stem().eval().half().cuda()
    x = torch.randn(4, 80, 300, device="cuda").half()
    compiled = co.compile(m, (x,), glue=glue, dynamic_batch=True)
    assert len(compiled.plan.regions) == 3, compiled.report.format()
    assert [r.problem.h for r in compiled.plan.regions] == [1, 1, 1]
    check_batches(compiled, m, lambda b: torch.randn(b, 80, 300, device="cuda").half(), (4, 3))


class TokenGroupNorm(nn.Module):
    """The VAE attention's group norm: (B, HW, C) tokens normalized as group_norm(x^T)."""

    def __init__(self, c=128, groups=32):
        super().__init__()
        self.gn = nn.GroupNorm(groups, c, eps=1e-6)

    def forward(self, x):
        return F.silu(self.gn(x.transpose(1, 2))).transpose(1, 2)


@pytest.mark.parametrize("glue", ["eager", "inductor"])
def test_3d_group_norm_offloads_and_matches(glue):
    torch.manual_seed(0)
    m = TokenGroupNorm().eval().half().cuda()
    x = torch.randn(2, 4096, 128, device="cuda").half()
    compiled = co.compile(m, (x,), glue=glue, dynamic_batch=True)
    (r,) = compiled.plan.regions
    assert r.form == "group_norm" and r.problem.h == 1 and r.problem.silu, compiled.report.format()
    check_batches(compiled, m, lambda b: torch.randn(b, 4096, 128, device="cuda").half(), (2, 3))
    assert compiled.layout_conversions() == 0          # x^T viewed as (N, C, 1, L) is channels_last
