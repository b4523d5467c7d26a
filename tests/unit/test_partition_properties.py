"""Property tests of the partitioner (no GPU): for random shapes and batch
broadcasts, a region is offloaded exactly when a kernel can run it, with
alignments that divide the extents, and the rest falls back with the reason."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cutlass_offload.capture import capture
from cutlass_offload.partition import partition

SIZES = st.sampled_from([1, 2, 3, 5, 7, 8, 13, 16, 24, 40, 64])
BATCH = st.lists(st.sampled_from([1, 2, 3]), min_size=0, max_size=2)


class MatMul(torch.nn.Module):
    def forward(self, x, w):
        return torch.relu(x @ w)


def _strip(dims):
    dims = list(dims)
    while dims and dims[0] == 1:
        dims.pop(0)
    return dims


@settings(max_examples=40, deadline=None, derandomize=True)
@given(m=SIZES, k=SIZES, n=SIZES, ba=BATCH, bb=BATCH, dtype=st.sampled_from([torch.float16, torch.bfloat16]))
def test_offload_decision_and_alignment(m, k, n, ba, bb, dtype):
    x, w = torch.randn(*ba, m, k, dtype=dtype), torch.randn(*bb, k, n, dtype=dtype)
    try:
        torch.broadcast_shapes(x.shape[:-2], w.shape[:-2])
    except RuntimeError:
        return                                         # not a valid matmul at all
    part = partition(capture(MatMul(), (x, w)).graph_module)
    sa, sb = _strip(ba), _strip(bb)
    partial = bool(sa) and bool(sb) and sa != sb
    (region,) = part.regions
    p = region.problem
    assert p.n == n and p.k == k and p.dtype == {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    assert k % p.align_a == 0 and n % p.align_c == 0 and p.align_a <= 8
    assert (k if p.layout_b == "col" else n) % p.align_b == 0
    assert p.epilogue.activation == "relu"
    assert region.batch_mode == ("fold" if not sb else "a_broadcast" if not sa
                                 else "expand" if partial else "batched")
