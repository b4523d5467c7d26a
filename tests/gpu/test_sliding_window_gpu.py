"""GPU (sm_90): sliding-window causal attention (transformers' ``sliding_window``) on the
Hopper kernel's WindowFusion (emit/attention_sm90.py): the suite's window cases
(tests/attention_cases.sliding_window_cases: SDPA's boolean mask, grouped K/V heads in
BSNH, the hand-written masked_fill, a window as wide as the rows) against a float64
reference, and transformers' Gemma 2 (soft-capped, eager attention) and Gemma 3 (SDPA)
with windows shorter than the sequence, against float32. Fresh inputs, the allocator
poisoned, every region on its kernel. Gemma's zero-centred RMSNorm weights run the
norm kernel's unit offset there too (eager glue offloads the norms)."""
import pytest
import torch

from attention_cases import SuiteModel, case_id, reference, rel_err_nan, sliding_window_cases, suite_inputs
from cutlass_offload.ir import AttentionRegion, NormRegion
from cutlass_offload.ir.attention import AttentionKernelSm90
from helpers import assert_regions_ran, compile_and_check_lm, poison_allocator

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU (H100 / H200)")]

TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


def test_window_cases_match_float64():
    import cutlass_offload as co
    cases = sliding_window_cases()
    model = SuiteModel(cases)
    m = co.compile(model, suite_inputs(cases, "cuda"), arch="sm_90a", glue="eager")
    assert [r.problem.window for r in m.plan.regions] == [48, 100, 32, 0], m.report.format()
    assert all(isinstance(k, AttentionKernelSm90) for k in m.plan.kernels)
    for trial in range(2):
        xs = suite_inputs(cases, "cuda", seed=10 + trial * 100)
        poison_allocator()
        with torch.no_grad():
            outs = m(*xs)
        torch.cuda.synchronize()
        bad = []
        for c, args, out in zip(cases, model.split(xs), outs):
            err = rel_err_nan(out, reference(c, *args))
            if not err <= TOL[out.dtype]:
                bad.append(f"{case_id(c)}: rel err {err:.2e}")
        assert not bad, bad
    assert_regions_ran(m)


def _windows(m, want):
    att = [r for r in m.plan.regions if isinstance(r, AttentionRegion)]
    assert sorted(r.problem.window for r in att) == want, m.report.format()
    assert all(isinstance(k, AttentionKernelSm90) for k in m.plan.kernels if k.kind == "attention")


def test_transformers_gemma2_sliding_window_matches_float32():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Gemma2Config(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=64,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, use_cache=False,
        attn_implementation="eager")   # transformers' SDPA path drops the soft-cap

    def check(m):
        _windows(m, [0, 64])                  # layer 0 slides, layer 1 is global
        assert all(r.problem.softcap == 50.0 for r in m.plan.regions if isinstance(r, AttentionRegion))
    compile_and_check_lm(transformers.Gemma2ForCausalLM(cfg), 512, check, seq=256)


def test_transformers_gemma3_sliding_window_matches_float32():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=64,
        use_cache=False, attn_implementation="sdpa")

    def check(m):
        _windows(m, [64, 64])                 # both layers slide (one global in six)
        norms = [r for r in m.plan.regions if isinstance(r, NormRegion)]
        assert norms and all(r.problem.unit_offset for r in norms), m.report.format()
    compile_and_check_lm(transformers.Gemma3ForCausalLM(cfg), 512, check, seq=256)
