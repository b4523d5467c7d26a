"""GPU: hand-written attention with a tanh soft-cap on its logits (Gemma 2) runs the
Hopper kernel's SoftcapFusion (emit/attention_sm90.py): the form alone, causal or not,
fp16 / bf16, and transformers' Gemma2ForCausalLM (eager attention, every layer's
window as long as the sequence), fresh inputs, outputs poisoned, against float32. Eager glue: the regions' kernels are what is tested."""
import pytest
import torch

import cutlass_offload as co
from attention_models import GEMMA2_SHAPE, gemma2_attention
from cutlass_offload.ir import AttentionRegion
from cutlass_offload.ir.attention import AttentionKernelSm90
from helpers import assert_regions_ran, check_fresh_outputs, compile_and_check_lm

pytestmark = pytest.mark.gpu


B, NH, L, D = GEMMA2_SHAPE


class Softcapped(torch.nn.Module):
    def __init__(self, causal):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        # logits of a few tens, so the cap at 50 bends them (tanh(0.6) = 0.54)
        return (gemma2_attention(q * 3, k * 3, v, self.causal),)


def _qkv(seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(B, NH, L, D, generator=g, device="cuda").to(dtype) for _ in range(3))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_softcapped_attention_matches_float32(causal, dtype):
    m = co.compile(Softcapped(causal), _qkv(0, dtype), arch="sm_90a", glue="eager")
    (k,) = m.plan.distinct_kernels
    assert isinstance(k, AttentionKernelSm90) and k.softcap == 50.0, m.report.format()
    check_fresh_outputs(m, Softcapped(causal), lambda r: _qkv(r + 1, dtype), dtype, ["attention"])
    assert_regions_ran(m)


def test_transformers_gemma2_matches_float32():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Gemma2Config(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=4096,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, use_cache=False,
        attn_implementation="eager")   # transformers' SDPA path drops the soft-cap

    def two_softcapped_attentions(m):
        att = [r for r in m.plan.regions if isinstance(r, AttentionRegion)]
        assert len(att) == 2 and all(r.problem.softcap == 50.0 for r in att), m.report.format()
    compile_and_check_lm(transformers.Gemma2ForCausalLM(cfg), 512, two_softcapped_attentions)
