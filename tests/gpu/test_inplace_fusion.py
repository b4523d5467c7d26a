"""GPU: in-place activations and residual adds (torchvision's ``ReLU(inplace=True)``
and ``out += identity``) fuse into conv and GEMM epilogues and match a float32
reference, under eager and Inductor glue."""
import pytest
import torch
import torch.nn as nn
from block_cases import BasicBlock
from helpers import check_batches

from cutlass_offload.api import compile_captured
from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions

pytestmark = pytest.mark.gpu


class Bottleneck(nn.Module):
    """tests/block_cases.BasicBlock, then a linear head with an in-place SiLU."""

    def __init__(self, c=64):
        super().__init__()
        self.block, self.head = BasicBlock(c), nn.Linear(c, 32)

    def forward(self, x):
        h = self.head(self.block(x).mean((2, 3)))
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
    check_batches(compiled, m, lambda b: torch.randn(b, 64, 16, 16, device="cuda", dtype=torch.float16)
                  .contiguous(memory_format=torch.channels_last), (4, 3))
