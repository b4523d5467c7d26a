"""GPU: in-place activations and residual adds (torchvision's ``ReLU(inplace=True)``
and ``out += identity``) fuse into conv and GEMM epilogues and match a float32
reference, under eager and Inductor glue."""
import copy

import pytest
import torch
import torch.nn as nn

from cutlass_offload.api import compile_captured
from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from helpers import TOLERANCE, poison_allocator, rel_err

pytestmark = pytest.mark.gpu


class Bottleneck(nn.Module):
    def __init__(self, c=64):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.head = nn.Linear(c, 32)
        for bn in (self.bn1, self.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        out = self.relu(out)
        h = self.head(out.mean((2, 3)))
        return nn.functional.silu(h, inplace=True)


@pytest.mark.parametrize("glue", ["eager", "inductor"])
def test_inplace_ops_fuse_and_match(glue):
    torch.manual_seed(0)
    m = Bottleneck().eval().half().cuda().to(memory_format=torch.channels_last)
    x = torch.randn(4, 64, 16, 16, device="cuda", dtype=torch.float16).contiguous(
        memory_format=torch.channels_last)
    compiled = compile_captured(capture(m, (x,), dynamic_batch=True),
                                CompileOptions(arch="sm90a", pytorch_when_faster=False), glue=glue)
    tags = sorted(r.problem.epilogue.tag for r in compiled.plan.regions)
    assert tags == ["bias_relu", "bias_resadd_relu", "bias_silu"], compiled.report.format()
    ref_model = copy.deepcopy(m).float()
    for batch in (4, 3):
        xn = torch.randn(batch, 64, 16, 16, device="cuda", dtype=torch.float16).contiguous(
            memory_format=torch.channels_last)
        poison_allocator()
        with torch.no_grad():
            out = compiled(xn)
            ref = ref_model(xn.float())
        assert rel_err(out, ref) <= TOLERANCE[torch.float16], batch
    assert sum(mod.fallback_calls for mod in compiled.region_modules()) == 0
