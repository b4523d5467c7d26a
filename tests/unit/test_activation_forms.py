"""Written-out activations become their ATen op (partition/activation_forms.py) and
fuse into the GEMM / conv epilogue; look-alikes stay as written. No GPU, no nvcc."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cutlass_offload.capture import capture
from cutlass_offload.partition import partition
from cutlass_offload.partition.activation_forms import fuse_activation_forms
from cutlass_offload.partition.canonicalize import canonicalize
from cutlass_offload.partition.graph_utils import aten

H = torch.float16
SQRT2 = math.sqrt(2.0)

# (the activation as a model writes it, the epilogue's activation name)
WRITTEN = [
    (lambda t: t * torch.sigmoid(t), "silu"),
    (lambda t: torch.sigmoid(t) * t, "silu"),
    (lambda t: t / (1.0 + torch.exp(-t)), "silu"),
    (lambda t: 0.5 * t * (1.0 + torch.erf(t / SQRT2)), "gelu_erf"),
    (lambda t: t * 0.5 * (1.0 + torch.erf(t * 0.7071067811865476)), "gelu_erf"),
    (lambda t: t * (1.0 + torch.erf(t / SQRT2)) / 2, "gelu_erf"),
    (lambda t: 0.5 * t * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (t + 0.044715 * torch.pow(t, 3.0)))),
     "gelu_tanh"),
    (lambda t: 1.0 / (1.0 + torch.exp(-t)), "sigmoid"),
    (lambda t: t * F.relu6(t + 3.0) / 6.0, "hardswish"),
    (lambda t: t * torch.clamp(t + 3.0, 0.0, 6.0) / 6.0, "hardswish"),
    (lambda t: F.relu6(t + 3.0) / 6.0, "hardsigmoid"),
]

# near misses: not one of the forms (or not only of x), so they stay as written
LOOK_ALIKES = [
    lambda t: t * torch.sigmoid(2.0 * t),
    lambda t: 0.5 * t * (1.0 + torch.erf(t / 1.414)),          # a truncated constant
    lambda t: t * torch.sigmoid(t) + 1.0,
    lambda t: 0.5 * t * (1.0 + torch.tanh(0.8 * t)),
]


class Lin(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.l = nn.Linear(32, 48)
        self.act = act

    def forward(self, x):
        return self.act(self.l(x))


def _graph(act, dtype=torch.float32):
    torch.manual_seed(0)
    m = Lin(act).to(dtype).eval()
    x = torch.randn(4, 7, 32, dtype=dtype)
    return m, x, capture(m, (x,)).graph_module


@pytest.mark.parametrize("case", range(len(WRITTEN)))
def test_written_activation_fuses_into_the_gemm(case):
    act, name = WRITTEN[case]
    _, _, gm = _graph(act, H)
    part = partition(gm)
    (region,) = part.regions
    assert region.problem.epilogue.activation == name
    assert region.problem.epilogue.bias


@pytest.mark.parametrize("case", range(len(WRITTEN)))
def test_rewritten_graph_computes_the_same(case):
    """The canonicalized graph against the module, in float64 on fresh inputs."""
    act, _ = WRITTEN[case]
    m, x, gm = _graph(act, torch.float64)
    canonicalize(gm)
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert not any(t in ops for t in (aten.erf.default, aten.tanh.default, aten.exp.default))
    for _ in range(3):
        fresh = torch.randn_like(x) * 4
        out = gm(fresh)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, m(fresh), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", range(len(LOOK_ALIKES)))
def test_look_alikes_stay_as_written(case):
    m, x, gm = _graph(LOOK_ALIKES[case], torch.float64)
    before = [n.target for n in gm.graph.nodes]
    assert fuse_activation_forms(gm.graph) == []
    assert [n.target for n in gm.graph.nodes] == before


def test_an_input_used_elsewhere_stays():
    """x * sigmoid(x) where x is also returned: the GEMM's output must be stored, so
    the product stays; a fused silu would still be right, but nothing is gained."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(32, 48)

        def forward(self, x):
            y = self.l(x)
            return y * torch.sigmoid(y), y
    gm = capture(M().eval(), (torch.randn(3, 32),)).graph_module
    assert fuse_activation_forms(gm.graph) == []


def test_conv_takes_a_written_silu():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(16, 32, 3, padding=1)

        def forward(self, x):
            y = self.c(x)
            return y * torch.sigmoid(y)
    m = M().to(H).eval().to(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 8, 8).to(H).to(memory_format=torch.channels_last)
    (region,) = partition(capture(m, (x,)).graph_module).regions
    assert region.problem.epilogue.activation == "silu"
