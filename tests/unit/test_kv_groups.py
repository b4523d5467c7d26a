"""Grouped-query attention with K and V read in place (partition/kv_groups.py,
AttentionProblem.kv_group): the model's repeat_kv copies join the region, SDPA's
enable_gqa is taken as it is, both kernels compile the grouping in
(emit/attention.py, emit/attention_sm90.py, templates/fmha_gqa_mainloop.h). No GPU,
no nvcc."""
import pytest
import torch
import torch.nn.functional as F

from attention_models import repeat_kv
from cutlass_offload.capture import capture
from cutlass_offload.emit import attention as emit_a80, attention_sm90 as emit_a90
from cutlass_offload.families import attention
from cutlass_offload.ir import AttentionRegion
from cutlass_offload.ir.attention import AttentionKernel, AttentionKernelSm90, AttentionProblem
from cutlass_offload.partition import kv_groups, partition
from cutlass_offload.select import select
from helpers import Fn

B, HQ, HKV, L, D = 2, 8, 2, 64, 32


@pytest.fixture(autouse=True)
def gqa_on(monkeypatch):
    """Grouped-query attention read in place, whatever partition/kv_groups.GQA_IN_PLACE's default."""
    monkeypatch.setattr(kv_groups, "GQA_IN_PLACE", True)
G = HQ // HKV


def _qkv(dtype=torch.float16):
    return (torch.randn(B, HQ, L, D).to(dtype), torch.randn(B, HKV, L, D).to(dtype),
            torch.randn(B, HKV, L, D).to(dtype))


def repeated(q, k, v):
    return F.scaled_dot_product_attention(q, repeat_kv(k, G), repeat_kv(v, G), is_causal=True)


def hand_written(q, k, v):
    k, v = repeat_kv(k, G), repeat_kv(v, G)
    s = torch.softmax((q @ k.transpose(-1, -2)) * D ** -0.5, dim=-1, dtype=torch.float32)
    return s.to(q.dtype) @ v


def _one_region(fn, xs=None):
    gm = capture(Fn(fn), xs or _qkv()).graph_module
    part = partition(gm)
    assert [type(r) for r in part.regions] == [AttentionRegion], part
    return gm, part, part.regions[0]


@pytest.mark.parametrize("fn", [repeated, hand_written])
def test_repeated_kv_is_read_in_place(fn):
    gm, part, r = _one_region(fn)
    assert r.problem.kv_group == G and r.problem.heads == HQ
    nodes = {n.name: n for n in gm.graph.nodes}
    # the region reads the graph's inputs k and v, the repeats are its own nodes
    assert nodes[r.k].op == "placeholder" and nodes[r.v].op == "placeholder"
    assert sum(nodes[n].target is torch.ops.aten.expand.default for n in r.nodes) == 2
    assert any("read in place" in n for n in r.notes)
    (k,) = select(part, "sm90a").kernels
    assert isinstance(k, AttentionKernelSm90) and k.kv_group == G and k.name.endswith(f"_gqa{G}")


def test_sdpa_enable_gqa_is_one_grouped_region():
    _, _, r = _one_region(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    assert r.problem.kv_group == G and r.problem.causal == "none"


def test_a_repeat_read_elsewhere_is_kept():
    """K's repeat also leaves the graph: the copy is needed anyway, the region reads it."""
    def fn(q, k, v):
        kr = repeat_kv(k, G)
        return F.scaled_dot_product_attention(q, kr, repeat_kv(v, G)), kr
    gm = capture(Fn(fn), _qkv()).graph_module
    (r,) = [r for r in partition(gm).regions if isinstance(r, AttentionRegion)]
    assert r.problem.kv_group == 1


def test_switched_off(monkeypatch):
    monkeypatch.setattr(kv_groups, "GQA_IN_PLACE", False)
    _, _, r = _one_region(repeated)
    assert r.problem.kv_group == 1
    gm = capture(Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
                 _qkv()).graph_module
    part = partition(gm)
    assert not part.regions
    assert any("GQA_IN_PLACE" in f.reason for f in part.fallbacks), part.fallbacks


def test_kernels_compile_the_group_in():
    p = AttentionProblem(heads=HQ, seq_q=L, seq_kv=L, head_dim=D, head_dim_v=D, dtype="f16",
                         scale=0.125, causal="top_left", kv_group=G)
    hopper = attention.choose(p, "sm90a")
    sm80 = attention.choose(p, "sm80")
    assert isinstance(hopper, AttentionKernelSm90) and isinstance(sm80, AttentionKernel)
    h_src, s_src = emit_a90.emit(hopper).code, emit_a80.emit(sm80).code
    assert f"constexpr int kKvGroup = {G};" in h_src and "co_fmha::GqaMainloop" in h_src
    assert "cute::tuple<cute::_0, int>" in h_src and "if (a.heads % kKvGroup) return false;" in h_src
    assert f"constexpr int64_t kKvGroup = {G};" in s_src and f"a.heads % {G}" in s_src
    plain = AttentionProblem(heads=HQ, seq_q=L, seq_kv=L, head_dim=D, head_dim_v=D, dtype="f16",
                             scale=0.125, causal="top_left")
    for k, em in ((attention.choose(plain, "sm90a"), emit_a90), (attention.choose(plain, "sm80"), emit_a80)):
        assert "kKvGroup" not in em.emit(k).code and "gqa" not in k.name


def test_kv_group_must_divide_the_heads():
    with pytest.raises(ValueError, match="kv_group"):
        AttentionProblem(heads=6, seq_q=8, seq_kv=8, head_dim=8, head_dim_v=8, dtype="f16",
                         scale=1.0, kv_group=4)
    with pytest.raises(ValueError, match="kv_group"):
        AttentionKernel(arch="sm80", dtype="f16", config=attention.config_for("f16", (64, 64, 64)),
                        kv_group=0)


def test_transformers_llama_reads_kv_in_place():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512,
                                   num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                                   use_cache=False, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg).half().eval()
    gm = capture(model, (torch.randint(0, 256, (2, 64)),)).graph_module
    att = [r for r in partition(gm).regions if isinstance(r, AttentionRegion)]
    assert len(att) == 2 and all(r.problem.kv_group == 4 and r.problem.causal == "top_left"
                                 for r in att), att
