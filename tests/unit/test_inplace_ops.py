"""In-place ops (no GPU): canonicalize rewrites ``op_`` to ``op`` only where nobody
can observe the write, and the rewritten ops then fuse into epilogues like their
out-of-place forms (torchvision's ResNet-50: ``relu_`` and ``out += identity``)."""
import pytest
import torch
import torch.nn as nn
from block_cases import BasicBlock

from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.partition import partition

aten = torch.ops.aten
TF32 = CompileOptions(arch="sm90a", allow_tf32=True)


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def captured(model, *inputs):
    torch.manual_seed(0)
    return capture(model.eval(), inputs).graph_module


def test_inplace_chain_becomes_functional_and_fuses():
    torch.manual_seed(0)
    m, x = BasicBlock(), torch.randn(2, 16, 8, 8)
    gm = captured(m, x)
    t = targets(gm)
    assert aten.relu_.default not in t and aten.add_.Tensor not in t
    assert t.count(aten.relu.default) == 2 and aten.add.Tensor in t
    with torch.no_grad():
        torch.testing.assert_close(gm(x), m(x.clone()), rtol=1e-5, atol=1e-5)
    part = partition(gm, TF32)
    assert [r.problem.epilogue.tag for r in part.regions] == ["bias_relu", "bias_resadd_relu"]


def test_inplace_silu_and_hardswish_fuse_into_linear():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 32)

        def forward(self, x):
            return nn.functional.hardswish(nn.functional.silu(self.a(x), inplace=True)
                                           .mul_(2.0), inplace=True) + self.b(x).relu_()
    m, x = M(), torch.randn(4, 32)
    gm = captured(m, x)
    assert not any(str(t).split(".")[1].endswith("_") for t in targets(gm) if hasattr(t, "_schema"))
    with torch.no_grad():
        torch.testing.assert_close(gm(x), m(x), rtol=1e-5, atol=1e-5)


def test_write_to_an_input_is_kept():
    class M(nn.Module):
        def forward(self, x):
            x.relu_()
            return x * 2
    x = torch.randn(8)
    gm = captured(M(), x.clone())
    assert aten.relu_.default in targets(gm)
    xi = x.clone()
    with torch.no_grad():
        out = gm(xi)
    torch.testing.assert_close(out, x.relu() * 2)
    torch.testing.assert_close(xi, x.relu())        # the caller sees the write


class LinearThen(nn.Module):
    """A linear layer, then ``body`` on its output."""

    def __init__(self, body):
        super().__init__()
        self.lin, self.body = nn.Linear(8, 8), body

    def forward(self, x):
        return self.body(self.lin(x))


def _read_then_write(y):
    z = y * 2                       # reads y before the write
    y.relu_()
    return z + y


def _write_through_view(y):
    y.view(2, 16).relu_()           # writes y's memory
    return y + 1


@pytest.mark.parametrize("body", [_read_then_write, _write_through_view])
def test_write_another_reader_or_a_view_sees_is_kept(body):
    m, x = LinearThen(body), torch.randn(4, 8)
    gm = captured(m, x)
    assert aten.relu_.default in targets(gm)
    with torch.no_grad():
        torch.testing.assert_close(gm(x), m(x), rtol=1e-5, atol=1e-5)


def test_promoting_add_is_kept():
    class M(nn.Module):
        def forward(self, x, y):
            h = x * 2               # fp16, fresh
            h.add_(y)               # fp32 other: in place stays fp16, out of place would be fp32
            return h
    x, y = torch.randn(4, 8).half(), torch.randn(4, 8)
    gm = captured(M(), x, y)
    assert aten.add_.Tensor in targets(gm)
    out = gm(x, y)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, (x * 2).add_(y))
