"""A batch norm written out after a conv, ``conv(x) * scale + shift`` with per-channel
constants (torchvision's FrozenBatchNorm2d, DETR's backbone), folds into the conv's
weights like an eval BatchNorm2d (partition/canonicalize.py), so its ReLU fuses: the
partition, the rewritten graph's values in float64, the forms left alone. No GPU, no
nvcc."""
import pytest
import torch
from torch import nn

from cutlass_offload.capture import capture
from cutlass_offload.ir import ConvRegion
from cutlass_offload.partition import partition
from cutlass_offload.partition.graph_utils import aten


class FrozenBNConv(nn.Module):
    """torchvision.ops.FrozenBatchNorm2d after a bias-free conv, then a ReLU."""

    def __init__(self, c=32, conv_bias=False):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=conv_bias)
        g = torch.Generator().manual_seed(0)
        for n, t in (("weight", torch.rand(c, generator=g) + 0.5), ("bias", torch.randn(c, generator=g)),
                     ("running_mean", torch.randn(c, generator=g)),
                     ("running_var", torch.rand(c, generator=g) + 0.5)):
            self.register_buffer(n, t)

    def forward(self, x):
        x = self.conv(x)
        w, b = self.weight.reshape(1, -1, 1, 1), self.bias.reshape(1, -1, 1, 1)
        rv, rm = self.running_var.reshape(1, -1, 1, 1), self.running_mean.reshape(1, -1, 1, 1)
        scale = w * (rv + 1e-5).rsqrt()
        return torch.relu(x * scale + (b - rm * scale))


def _x(dtype, seed=0):
    return torch.randn(2, 32, 16, 16, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("conv_bias", [False, True])
def test_frozen_batch_norm_folds_and_the_relu_fuses(conv_bias):
    m = FrozenBNConv(conv_bias=conv_bias).half()
    part = partition(capture(m, (_x(torch.float16),)).graph_module)
    (r,) = part.regions
    assert isinstance(r, ConvRegion) and r.problem.epilogue.tag == "bias_relu", part


@pytest.mark.parametrize("conv_bias", [False, True])
def test_rewritten_graph_computes_the_same(conv_bias):
    m = FrozenBNConv(conv_bias=conv_bias).double()
    gm = capture(m, (_x(torch.float64),)).graph_module
    assert not [n for n in gm.graph.nodes if n.target is aten.rsqrt.default and n.users]
    for seed in range(2):
        x = _x(torch.float64, seed + 1)
        out = gm(x)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, m(x), rtol=1e-10, atol=1e-10)


def test_a_factor_from_an_input_stays():
    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(32, 32, 1)

        def forward(self, x, g):            # g (1, 32, 1, 1): per-call, not a constant
            return self.conv(x) * g + 1.0
    gm = capture(Gated().half(), (_x(torch.float16), torch.rand(1, 32, 1, 1).half())).graph_module
    assert [n for n in gm.graph.nodes if n.target is aten.mul.Tensor]
