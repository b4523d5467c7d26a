"""GPU: grouped-query attention with K and V read in place (partition/kv_groups.py):
query head h reads K/V head h // G on the Hopper kernel (templates/fmha_gqa_mainloop.h)
and, with an additive bias, on the sm80 kernel; K / V given repeated by the model
(transformers' repeat_kv) or as they are to SDPA with ``enable_gqa=True``, and
transformers' LlamaForCausalLM with 8 query / 2 K/V heads: fp16 / bf16, fresh inputs,
outputs poisoned, against float32. Eager glue: the regions' kernels are what is tested."""
import pytest
import torch
import torch.nn.functional as F

import cutlass_offload as co
from attention_models import repeat_kv
from cutlass_offload.ir import AttentionRegion
from cutlass_offload.ir.attention import AttentionKernel, AttentionKernelSm90
from cutlass_offload.partition import kv_groups
from helpers import assert_regions_ran, check_fresh_outputs, compile_and_check_lm

pytestmark = pytest.mark.gpu
B, HQ, HKV, L, D = 2, 8, 2, 200, 64       # L not a multiple of the tiles: partial tiles


@pytest.fixture(autouse=True)
def gqa_on(monkeypatch):
    """Grouped-query attention read in place, whatever partition/kv_groups.GQA_IN_PLACE's default."""
    monkeypatch.setattr(kv_groups, "GQA_IN_PLACE", True)


class Repeated(torch.nn.Module):
    def __init__(self, causal, biased=False):
        super().__init__()
        self.causal, self.biased = causal, biased

    def forward(self, q, k, v, bias=None):
        k, v = repeat_kv(k, HQ // HKV), repeat_kv(v, HQ // HKV)
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=self.causal),)


class EnableGqa(torch.nn.Module):
    def forward(self, q, k, v):
        return (F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),)


def _inputs(seed, dtype, bias=False):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, device="cuda").to(dtype)
    xs = (r(B, HQ, L, D), r(B, HKV, L, D), r(B, HKV, L, D))
    return xs + ((r(B, HQ, L, L),) if bias else ())


def _one_grouped_region(m, kernel_type):
    (r,) = m.plan.regions
    assert isinstance(r, AttentionRegion) and r.problem.kv_group == HQ // HKV, m.report.format()
    (k,) = m.plan.distinct_kernels
    assert isinstance(k, kernel_type) and k.kv_group == HQ // HKV, m.report.format()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_repeated_kv_read_in_place_on_the_hopper_kernel(causal, dtype):
    m = co.compile(Repeated(causal), _inputs(0, dtype), arch="sm_90a", glue="eager")
    _one_grouped_region(m, AttentionKernelSm90)
    check_fresh_outputs(m, Repeated(causal), lambda r: _inputs(r + 1, dtype), dtype, ["attention"])
    assert_regions_ran(m)


def test_repeated_kv_with_a_bias_on_the_sm80_kernel():
    dtype = torch.float16
    m = co.compile(Repeated(False, True), _inputs(0, dtype, True), arch="sm_90a", glue="eager")
    _one_grouped_region(m, AttentionKernel)
    check_fresh_outputs(m, Repeated(False, True), lambda r: _inputs(r + 1, dtype, True), dtype,
                        ["attention"])
    assert_regions_ran(m)


def test_sdpa_enable_gqa():
    dtype = torch.bfloat16
    m = co.compile(EnableGqa(), _inputs(0, dtype), arch="sm_90a", glue="eager")
    _one_grouped_region(m, AttentionKernelSm90)
    check_fresh_outputs(m, EnableGqa(), lambda r: _inputs(r + 1, dtype), dtype, ["attention"])
    assert_regions_ran(m)


def test_transformers_llama_reads_kv_in_place():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1024,
                                   num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                                   use_cache=False, attn_implementation="sdpa")

    def two_grouped_attentions(m):
        att = [r for r in m.plan.regions if isinstance(r, AttentionRegion)]
        assert len(att) == 2 and all(r.problem.kv_group == 4 and r.problem.causal != "none"
                                     for r in att), m.report.format()
    compile_and_check_lm(transformers.LlamaForCausalLM(cfg), 512, two_grouped_attentions)
