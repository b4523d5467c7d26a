"""partition/einsum.py: a two-operand einsum becomes matmul on permuted views (a
batched-matmul form) or ATen's own permutes, reshapes and one bmm (static sizes), which
partition into a GEMM region; the lowered graph
computes what einsum does (float64 on fresh inputs, also strided ones the example did
not have); what is not lowered stays an einsum, listed among the fallbacks."""
import pytest
import torch

from cutlass_offload.capture import capture
from cutlass_offload.partition import partition
from cutlass_offload.partition.einsum import einsum_as_bmm

H = torch.float16
CASES = [   # (equation, A, B, the lowered bmm's batch mode)
    ("bhqd,bhkd->bhqk", (2, 3, 9, 16), (2, 3, 11, 16), "batched"),
    ("bhqk,bhkd->bhqd", (2, 3, 9, 11), (2, 3, 11, 16), "batched"),
    ("...ij,jk->...ik", (4, 5, 6, 8), (8, 16), None),
    ("ij,jk", (10, 8), (8, 16), None),
    ("bnd,nde->bne", (4, 5, 8), (5, 8, 16), "batched"),
    ("bqd,kd->bqk", (2, 9, 16), (11, 16), None),
]


class Ein(torch.nn.Module):
    def __init__(self, equation):
        super().__init__()
        self.equation = equation

    def forward(self, a, b):
        return torch.einsum(self.equation, a, b)


@pytest.mark.parametrize("equation, sa, sb, mode", CASES)
def test_two_operand_einsum_becomes_one_gemm_region(equation, sa, sb, mode):
    m = Ein(equation)
    cap = capture(m, (torch.randn(sa, dtype=H), torch.randn(sb, dtype=H)))
    targets = [n.target for n in cap.graph_module.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.einsum.default not in targets
    assert {torch.ops.aten.bmm.default, torch.ops.aten.matmul.default} & set(targets)
    part = partition(cap.graph_module)
    assert len(part.regions) == 1 and not part.fallbacks, part.fallbacks
    if mode is not None:
        assert part.regions[0].batch_mode == mode
    for a, b in ((torch.randn(sa), torch.randn(sb)),
                 # other strides than the example's: the lowered reshapes copy where einsum would
                 (torch.randn(tuple(reversed(sa))).permute(*reversed(range(len(sa)))),
                  torch.randn(tuple(reversed(sb))).permute(*reversed(range(len(sb)))))):
        a, b = a.double(), b.double()
        torch.testing.assert_close(cap.graph_module(a, b), torch.einsum(equation, a, b))


def test_what_is_not_lowered_stays_an_einsum_with_a_reason():
    class Rest(torch.nn.Module):
        def forward(self, a, b, c, v, w):
            return (torch.einsum("ij,jk,kl->il", a, b, c),      # three operands
                    torch.einsum("i,j->ij", v, w),              # an outer product: no GEMM
                    torch.einsum("ij->i", a))                   # one operand, a sum
    xs = (torch.randn(3, 4, dtype=H), torch.randn(4, 5, dtype=H), torch.randn(5, 6, dtype=H),
          torch.randn(3, dtype=H), torch.randn(4, dtype=H))
    gm = capture(Rest(), xs).graph_module
    einsums = [n for n in gm.graph.nodes if n.target is torch.ops.aten.einsum.default]
    assert len(einsums) == 3
    part = partition(gm)
    assert not part.regions
    reasons = [f.reason for f in part.fallbacks if f.op == "einsum"]
    # each names the one cause that applies (fresh-user trial, session 55: the reason
    # listed every category)
    assert sorted(r.split(": ", 1)[1] for r in reasons) == sorted([
        "3 operands: only two-operand einsums are lowered",
        "'i,j->ij' contracts no index (an outer product or a sum): not a GEMM",
        "one operand, and not a pure reordering of its dims"]), reasons


def test_a_dynamic_batch_einsum_is_lowered_only_in_the_matmul_form():
    """A batched-matmul einsum becomes matmul on permuted views, any size dynamic; other
    forms would get traced reshapes fixing the batch: left to PyTorch (FLOPs counted)."""
    batch = torch.export.Dim("batch", min=2, max=64)
    cap = capture(Ein("bqd,bkd->bqk"), (torch.randn(4, 9, 16, dtype=H), torch.randn(4, 11, 16, dtype=H)),
                  dynamic_shapes=({0: batch}, {0: batch}))
    targets = [n.target for n in cap.graph_module.graph.nodes]
    assert torch.ops.aten.einsum.default not in targets and torch.ops.aten.matmul.default in targets
    a, b = torch.randn(7, 9, 16).double(), torch.randn(7, 11, 16).double()      # another batch
    torch.testing.assert_close(cap.graph_module(a, b), torch.einsum("bqd,bkd->bqk", a, b))
    cap = capture(Ein("bqd,kd->bqk"), (torch.randn(4, 9, 16, dtype=H), torch.randn(11, 16, dtype=H)),
                  dynamic_shapes=({0: batch}, None))
    assert any(n.target is torch.ops.aten.einsum.default for n in cap.graph_module.graph.nodes)
    assert not einsum_as_bmm(cap.graph_module)
    (fb,) = partition(cap.graph_module).fallbacks
    assert ("'bqd,kd->bqk' has 2 row and 1 column indices and the dynamic size at index 'b'"
            in fb.reason), fb.reason


def test_attention_written_with_einsums_is_one_attention_region():
    """softmax(einsum(q, k) * s) then einsum(p, v): the matmul form the attention matcher
    reads (a fresh-user trial, session 53: it became two GEMMs and the softmax's round
    trip)."""
    class Att(torch.nn.Module):
        def forward(self, q, k, v):
            s = torch.einsum("bhqd,bhkd->bhqk", q, k) * 0.125
            return torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v)
    xs = tuple(torch.randn(2, 4, 32, 64, dtype=H) for _ in range(3))
    cap = capture(Att(), xs)
    part = partition(cap.graph_module)
    assert [type(r).__name__ for r in part.regions] == ["AttentionRegion"], part.regions
    xs = tuple(x.double() for x in xs)
    torch.testing.assert_close(cap.graph_module(*xs), Att()(*xs))


def test_a_one_operand_reordering_is_a_permute():
    """diffusers' unpatchify (einsum("nhwpqc->nchpwq", x)) only reorders dims: it became
    a fallback 'left in PyTorch' with advice that could not apply (fresh-user trial,
    session 54). A one-operand einsum that sums stays a fallback."""
    from cutlass_offload.partition.einsum import einsum_as_bmm

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.einsum("nhwpqc->nchpwq", x), torch.einsum("nhwpqc->nc", x)
    x = torch.randn(2, 3, 4, 2, 2, 5, dtype=torch.float64)
    gm = capture(M(), (x,)).graph_module
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.aten.einsum.default) == 1 and torch.ops.aten.permute.default in ops
    out = gm(x)
    torch.testing.assert_close(out[0], torch.einsum("nhwpqc->nchpwq", x))
    torch.testing.assert_close(out[1], torch.einsum("nhwpqc->nc", x))
    part = partition(gm)
    assert [f.op for f in part.fallbacks] == ["einsum"]
    assert einsum_as_bmm(gm) is False
