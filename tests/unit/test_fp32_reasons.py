"""An fp32 GEMM / conv left in PyTorch (TF32 not allowed) says what a user can do without
costing accuracy: a model left in fp32 may be cast; an operand the model itself casts
to fp32 for the op (GPT-J's attention scores, RoPE's positions) gets no such advice."""
import torch
import torch.nn.functional as F

from cutlass_offload.capture import capture
from helpers import Fn
from cutlass_offload.partition import partition


def _reason(fn, *xs):
    part = partition(capture(Fn(fn), xs).graph_module)
    (fb,) = [f for f in part.fallbacks if f.op in ("matmul", "mm", "bmm", "linear", "conv2d")]
    return fb.reason


def test_a_model_in_fp32_may_be_cast():
    r = _reason(lambda a, b: a @ b, torch.randn(64, 32), torch.randn(32, 16))
    assert "TF32 not allowed" in r and "left in fp32 by mistake" in r


def test_gptj_style_upcast_scores_get_no_rounding_advice():
    def scores(q, k):
        q, k = q.to(torch.float32), k.to(torch.float32)
        return torch.matmul(q, k.transpose(-1, -2))
    q = torch.randn(2, 4, 16, 64, dtype=torch.float16)
    r = _reason(scores, q, q.clone())
    assert "casts an operand from float16 to fp32 for this op on purpose" in r
    assert "by mistake" not in r


def test_rope_positions_cast_from_int64():
    def angles(inv_freq, pos):
        return inv_freq[None, :, None] @ pos[:, None, :].float()
    r = _reason(angles, torch.randn(32), torch.arange(16)[None].expand(2, 16))
    assert "from int64" in r and "by mistake" not in r


def test_conv_on_an_upcast_input():
    w = torch.randn(8, 4, 3, 3)
    r = _reason(lambda x, w: F.conv2d(x.float(), w), torch.randn(1, 4, 8, 8, dtype=torch.float16), w)
    assert "fp32 conv" in r and "from float16" in r
