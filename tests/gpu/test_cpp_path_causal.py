"""GPU: a GPT-2-style causal attention block (a boolean causal buffer sliced to the
sequence length, folded into the kernel's causal argument and checked per shape)
compiled with a dynamic sequence length under Inductor glue. Its attention region
takes the length as an int and the mask as an input; both join the cached
signature, so plain calls of a cached length replay in the region op's C++ kernel
(the region's Python call count stays put), at two lengths, against float32."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cutlass_offload as co
from cutlass_offload.runtime import ops
from helpers import TOLERANCE, poison_allocator, rel_err

pytestmark = pytest.mark.gpu
H = torch.float16


class CausalBlock(nn.Module):
    def __init__(self, d=256, heads=4, max_len=512):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        keep = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool))
        self.register_buffer("bias", keep.view(1, 1, max_len, max_len), persistent=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias[:, :, :s, :s])
        return self.proj(a.transpose(1, 2).reshape(b, s, d))


def _input(seq, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(2, seq, 256, generator=g, device="cuda").to(H)


def test_causal_attention_with_dynamic_length_replays_in_cpp():
    torch.manual_seed(0)
    eager = CausalBlock().to("cuda", H).eval()
    ref = copy.deepcopy(eager).float()
    seq = torch.export.Dim("seq", min=16, max=256)
    torch._dynamo.reset()
    try:
        m = co.compile(eager, (_input(128, 0),), glue="inductor", dynamic_shapes=({1: seq},),
                       offload_norms="all")
        (att,) = [r for r in m.region_modules() if r.region.form == "sdpa"]
        assert att.region.mask_check and att._fast_guards() == (att._im,)
        assert ops._op_state["cpp"] is not None, "the C++ kernel of the region op is not installed"
        with torch.no_grad():
            for seq_len in (128, 64):
                for seed in (1, 2, 3):            # the first call of a length caches it
                    x = _input(seq_len, seed)
                    poison_allocator()
                    calls, py_calls = att.calls, att._calls
                    out = m(x)
                    err = rel_err(out, ref(x.float()))
                    assert err < TOLERANCE[H], (seq_len, seed, err)
                    assert att.calls == calls + 1
                replayed = att._calls == py_calls          # the last call: C++ only
                assert replayed, f"length {seq_len}: the attention took the Python path"
        assert att.fallback_calls == 0
    finally:
        torch._dynamo.reset()
