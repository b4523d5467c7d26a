"""Swin's window attention (no GPU): the relative position bias and the shift mask,
added around a view that splits the windows' batch, become one bias of the logits
(partition/window_bias.py), so the whole attention is one region; the rewritten
graph computes what the model does (checked on fresh inputs against the model in
float64 on the CPU)."""
import pytest
import torch
import torch.nn as nn

from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.ir import AttentionRegion
from cutlass_offload.partition import partition
from window_cases import WindowAttention, inputs

aten = torch.ops.aten
SM90 = CompileOptions(arch="sm90a")


def _has_window_views(gm) -> bool:
    return any(n.op == "call_function" and n.target in (aten.view.default, aten.reshape.default)
               and len(n.meta["val"].shape) == 5 and any(u.target is aten.add.Tensor for u in n.users)
               and n.args[0].target is aten.add.Tensor
               for n in gm.graph.nodes if "val" in n.meta and hasattr(n.meta["val"], "shape"))


@pytest.mark.parametrize("rel_bias", [True, False])
@pytest.mark.parametrize("split", ["explicit", "infer"])
def test_the_window_mask_becomes_one_bias_and_the_graph_computes_the_same(rel_bias, split):
    torch.manual_seed(0)
    m = WindowAttention(rel_bias=rel_bias, split=split).eval()
    gm = capture(m, inputs()).graph_module
    adds = [n for n in gm.graph.nodes if n.target is aten.add.Tensor
            and any(u.target in (aten._softmax.default, aten.softmax.int) for u in n.users)]
    assert len(adds) == 1 and not _has_window_views(gm), gm.graph
    x, mask = inputs(seed=1)                        # fresh inputs, a float64 model
    m64 = WindowAttention(rel_bias=rel_bias, split=split).double()
    m64.load_state_dict(m.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(gm(x, mask), m64(x.double(), mask.double()).float(),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rel_bias", [True, False])
def test_window_attention_is_one_region_with_a_float_bias(rel_bias):
    torch.manual_seed(0)
    m = WindowAttention(rel_bias=rel_bias).half().eval()
    part = partition(capture(m, inputs(dtype=torch.float16)).graph_module, SM90)
    att = [r for r in part.regions if isinstance(r, AttentionRegion)]
    assert len(att) == 1 and att[0].form == "softmax_attention", part.fallbacks
    r = att[0]
    assert r.bias is not None and r.bias_kind == "float"
    p = r.problem
    assert (p.batch, p.heads, p.seq_q, p.seq_kv, p.head_dim) == (8, 2, 16, 16, 32)
    assert p.scale == pytest.approx(32 ** -0.5)
    assert not [f for f in part.fallbacks if "matmul" in str(f) or "bmm" in str(f)], part.fallbacks


def test_a_dynamic_window_batch_is_rewritten_with_an_explicit_split():
    from torch.export import Dim
    torch.manual_seed(0)
    m = WindowAttention().eval()
    b = Dim("b", min=2, max=64)
    gm = capture(m, inputs(), dynamic_shapes=({0: 4 * b}, None)).graph_module
    assert not _has_window_views(gm)
    for batch in (2, 3):
        x, mask = inputs(batch=batch, seed=batch)
        with torch.no_grad():
            torch.testing.assert_close(gm(x, mask), m(x, mask), rtol=1e-5, atol=1e-5)


def test_other_views_around_the_logits_are_left_alone():
    """A view that does not split the batch (here: the heads) is not this form: the
    graph keeps it, and it still computes the model."""
    class Other(nn.Module):
        def forward(self, q, k, v, b):
            a = q @ k.transpose(-2, -1)
            a = a.view(a.shape[0], 2, a.shape[1] // 2, a.shape[2], a.shape[3]) + b
            return a.view(q.shape[0], q.shape[1], q.shape[2], q.shape[2]).softmax(-1) @ v
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    b = torch.randn(1, 2, 1, 8, 8)
    gm = capture(Other(), (q, k, v, b)).graph_module
    assert any(n.target in (aten.view.default, aten.reshape.default) and len(n.meta["val"].shape) == 5
               for n in gm.graph.nodes if n.op == "call_function")
    with torch.no_grad():
        torch.testing.assert_close(gm(q, k, v, b), Other()(q, k, v, b))


def test_a_window_batch_of_whole_images_is_one_region_a_symbolic_window_count_says_why():
    """The window batch as a model gives it (a multiple of the window count) is one
    attention region; with the window count a symbol of its own (the mask an input,
    dim 0 of every input dynamic) the model's view(-1, H, N, N) gives the
    probabilities a batch that does not provably equal v's: that matmul stays in
    PyTorch and the fallback says so."""
    from torch.export import Dim
    torch.manual_seed(0)
    m = WindowAttention().half().eval()
    xs = inputs(dtype=torch.float16)
    whole = capture(m, xs, dynamic_shapes=({0: 4 * Dim("b", min=1, max=64)}, None))
    part = partition(whole.graph_module, SM90)
    assert len([r for r in part.regions if isinstance(r, AttentionRegion)]) == 1, part.fallbacks
    part = partition(capture(m, xs, dynamic_batch=True).graph_module, SM90)
    assert not [r for r in part.regions if isinstance(r, AttentionRegion)]
    assert any("provably" in f.reason for f in part.fallbacks), part.fallbacks
