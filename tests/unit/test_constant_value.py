"""partition/constants.py: the compile-time value of a node (masks folded into the
attention kernel's causal mode)."""
import torch
import torch.fx as fx

from cutlass_offload.capture import capture
from cutlass_offload.ir import AttentionRegion
from cutlass_offload.partition import partition
from cutlass_offload.partition.constants import constant_value

aten = torch.ops.aten


class TensorConstantMask(torch.nn.Module):
    """A causal mask from ``torch.where(keep, torch.tensor(0.0), min)``: the scalar
    tensor is a lifted constant, ``lift_fresh_copy`` then ``detach_`` in the exported
    graph (transformers 5.17's BLOOM mask)."""

    def forward(self, q, k, v):
        L = q.shape[-2]
        keep = torch.ones(L, L, dtype=torch.bool).tril()
        mask = torch.where(keep, torch.tensor(0.0, dtype=q.dtype), torch.finfo(q.dtype).min)
        w = q @ k.transpose(-1, -2) * 0.125 + mask
        return torch.softmax(w.float(), -1).to(q.dtype) @ v


def test_a_mask_through_detach_folds_into_the_causal_mode():
    q, k, v = (torch.randn(2, 4, 64, 32).half() for _ in range(3))
    gm = capture(TensorConstantMask(), (q, k, v)).graph_module
    assert any(n.target is aten.detach_.default for n in gm.graph.nodes)
    part = partition(gm)
    (r,) = part.regions
    assert isinstance(r, AttentionRegion) and r.problem.causal == "top_left", part


def test_detach_is_evaluated_out_of_place():
    """Evaluating ``detach_`` of a module's parameter must leave the parameter as it is."""
    root = torch.nn.Module()
    root.w = torch.nn.Parameter(torch.randn(4, 4))
    g = fx.Graph()
    w = g.get_attr("w")
    d = g.call_function(aten.detach_.default, (w,))
    out = g.call_function(aten.mul.Tensor, (d, 2.0))
    g.output(out)
    fx.GraphModule(root, g)       # owns the graph: get_attr reads root.w
    value, symbolic = constant_value(out)
    assert torch.equal(value, root.w.detach() * 2) and not symbolic
    assert root.w.requires_grad and root.w.grad_fn is None
