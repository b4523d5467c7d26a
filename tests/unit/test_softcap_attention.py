"""Hand-written attention with a tanh soft-cap on its logits (Gemma 2's
``attn_logit_softcapping``: ``c * tanh(s / c)`` before the mask and the softmax) is
one attention region on sm_90a, the Hopper kernel's SoftcapFusion holding the cap and
the scale (partition/attention_forms.py, emit/attention_sm90.py); what it cannot run
stays in PyTorch with the reason. No GPU, no nvcc."""
import pytest
import torch

from cutlass_offload.capture import capture
from cutlass_offload.emit import attention_sm90 as emit_a90
from cutlass_offload.families import attention, attention_sm90
from cutlass_offload.ir import AttentionRegion
from cutlass_offload.ir.attention import AttentionKernelSm90, AttentionProblem
from cutlass_offload.partition import attention_forms, partition
from cutlass_offload.select import select
from attention_models import CAP, GEMMA2_SHAPE, SCALING, gemma2_attention
from helpers import Fn

H = torch.float16
B, NH, L, D = GEMMA2_SHAPE


@pytest.fixture(autouse=True)
def softcap_on(monkeypatch):
    """The match as it runs with the switch on (partition/attention_forms.SOFTCAP)."""
    monkeypatch.setattr(attention_forms, "SOFTCAP", True)


def _qkv(dtype=H):
    return tuple(torch.randn(B, NH, L, D).to(dtype) for _ in range(3))


@pytest.mark.parametrize("causal", [True, False])
def test_softcapped_attention_is_one_region_on_the_hopper_kernel(causal):
    part = partition(capture(Fn(lambda q, k, v: gemma2_attention(q, k, v, causal)), _qkv()).graph_module)
    assert [type(r) for r in part.regions] == [AttentionRegion], part
    (r,) = part.regions
    p = r.problem
    assert p.softcap == CAP and p.scale == pytest.approx(SCALING, rel=1e-12)
    assert p.causal == ("top_left" if causal else "none") and p.bias == "none"
    assert r.problem.epilogue.tag == ("causal_softcap" if causal else "softcap")
    plan = select(part, "sm90a")
    (k,) = plan.kernels
    assert isinstance(k, AttentionKernelSm90) and k.softcap == CAP and k.scale == p.scale
    assert k.causal == causal and "_softcap" in k.name


def test_the_sm80_target_leaves_it_in_pytorch_with_the_reason():
    part = partition(capture(Fn(gemma2_attention), _qkv()).graph_module)
    plan = select(part, "sm80")
    assert not plan.regions
    (f,) = plan.fallbacks
    assert "soft-cap" in f.reason and "sm_90a" in f.reason


@pytest.mark.parametrize("what", ["shift", "bias"])
def test_a_shift_or_bias_before_the_cap_is_refused(what):
    kw = {"shift": 1.5} if what == "shift" else {"bias": torch.randn(L, L).to(H)}
    part = partition(capture(Fn(lambda q, k, v: gemma2_attention(q, k, v, **kw)), _qkv()).graph_module)
    assert not [r for r in part.regions if isinstance(r, AttentionRegion)]
    # a bias is refused at the scaling by 1 / cap after it, a shift at the tanh
    why = "before the tanh soft-cap" if what == "shift" else "scaled after the mask"
    assert any(f.op == "softmax_attention" and why in f.reason for f in part.fallbacks), part.fallbacks


def test_the_kernel_source_holds_cap_and_scale():
    prob = AttentionProblem(heads=NH, seq_q=L, seq_kv=L, head_dim=D, head_dim_v=D, dtype="f16",
                            scale=SCALING, batch=B, causal="top_left", softcap=CAP)
    k = attention_sm90.choose(prob)
    code = emit_a90.emit(k).code
    assert "struct SoftcapFusion : cutlass::fmha::collective::CausalFusion" in code
    assert "kCap = 50.0f" in code and "kInner = 0.0012499999720603228f" in code
    assert "constexpr float kCompiledScale = 0.0625f;" in code
    assert "if (a.scale != kCompiledScale) return false;" in code
    assert "p.mainloop.scale_softmax = 1.0f;" in code
    plain = attention_sm90.choose(AttentionProblem(heads=NH, seq_q=L, seq_kv=L, head_dim=D,
                                                   head_dim_v=D, dtype="f16", scale=SCALING))
    assert "SoftcapFusion" not in emit_a90.emit(plain).code and plain.softcap == 0.0
    # a bias sends the problem to the sm80 kernel, which has no soft-cap
    biased = AttentionProblem(heads=NH, seq_q=L, seq_kv=L, head_dim=D, head_dim_v=D, dtype="f16",
                              scale=SCALING, bias="add", softcap=CAP)
    assert "soft-cap" in attention.refusal(biased, "sm90a")
    with pytest.raises(ValueError, match="softcap"):
        AttentionProblem(heads=1, seq_q=1, seq_kv=1, head_dim=8, head_dim_v=8, dtype="f16",
                         scale=1.0, softcap=-1.0)


def test_with_the_switch_off_it_stays_in_pytorch_with_the_reason(monkeypatch):
    monkeypatch.setattr(attention_forms, "SOFTCAP", False)
    part = partition(capture(Fn(gemma2_attention), _qkv()).graph_module)
    assert not [r for r in part.regions if isinstance(r, AttentionRegion)]
    assert any("attention_forms.SOFTCAP" in f.reason for f in part.fallbacks), part.fallbacks


def test_the_sm80_fallback_names_the_softmax_and_counts_both_matmuls():
    """A region refused at kernel selection is reported at its softmax (not at a K/V
    repeat or transpose before it) with the FLOPs of its two matmuls."""
    import cutlass_offload as co
    d = co.explain(Fn(gemma2_attention), _qkv(), arch="sm_80")
    (f,) = d.report.to_dict()["fallbacks"]
    assert f["node"].startswith("softmax") and "soft-cap" in f["reason"]
    assert f["flops"] == 2 * (2 * B * NH * L * L * D)
