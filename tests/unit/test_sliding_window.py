"""Sliding-window causal masks (transformers' ``sliding_window``: Mistral, Gemma 2 / 3):
recognised in a compile-time mask (masks.mask_pattern), folded into the Hopper kernel
(``AttentionProblem.window``) for an sm_90a target, kept as the sm80 kernel's bias
elsewhere; the suite's window cases, run on the CPU as the kernels read their
arguments, match the float64 reference."""
import pytest
import torch
import torch.nn.functional as F

from attention_cases import (SuiteModel, case_id, reference, rel_err_nan, sliding_window_cases,
                             suite_inputs)
from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.emit import emit_kernel
from cutlass_offload.families import attention_sm90
from cutlass_offload.ir import AttentionKernelSm90, AttentionProblem, AttentionRegion
from cutlass_offload.masks import mask_pattern
from cutlass_offload.partition import partition
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.select import attention_tuning_id, select
from test_attention_partition import TOL, run_emulated


def _window(s, skv, w):
    i, j = torch.arange(s)[:, None], torch.arange(skv)[None, :]
    return (j <= i) & (j > i - w)


@pytest.mark.parametrize("w", [1, 7, 63])
def test_mask_pattern_reads_the_window(w):
    keep = _window(64, 64, w)
    assert mask_pattern(keep, "bool_keep", 64, 64) == ("top_left", False, w)
    assert mask_pattern(~keep, "bool_masked", 64, 64) == ("top_left", False, w)
    add = torch.zeros(64, 64, dtype=torch.float16).masked_fill(~keep, torch.finfo(torch.float16).min)
    assert mask_pattern(add[None, None].expand(2, 3, 64, 64), "float", 64, 64) == ("top_left", True, w)


def test_mask_pattern_plain_causal_and_not_a_window():
    assert mask_pattern(_window(32, 32, 32), "bool_keep", 32, 32) == ("top_left", False, 0)
    assert mask_pattern(_window(32, 32, 100), "bool_keep", 32, 32) == ("top_left", False, 0)
    odd = _window(32, 32, 8)
    odd[20, 2] = True                      # one key outside the band
    assert mask_pattern(odd, "bool_keep", 32, 32) is None
    per_head = torch.stack([_window(32, 32, 8), _window(32, 32, 9)])
    assert mask_pattern(per_head, "bool_keep", 32, 32) is None


class WindowSdpa(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.w = w

    def forward(self, q, k, v):
        s = q.shape[-2]
        i = torch.arange(s, device=q.device)[:, None]
        j = torch.arange(s, device=q.device)[None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (j > i - self.w))


def _plan(arch, w=32, s=128, dtype=torch.float16, e=64):
    q = torch.randn(2, 4, s, e, dtype=dtype)
    cap = capture(WindowSdpa(w), (q, q.clone(), q.clone()))
    return select(partition(cap.graph_module, CompileOptions(arch=arch)), arch)


def test_sm90a_folds_the_window_into_the_hopper_kernel():
    plan = _plan("sm90a")
    (r,) = plan.regions
    p = r.problem
    assert (p.causal, p.window, p.bias) == ("top_left", 32, "none") and r.mask is not None
    assert r.bias is None and r.name.endswith("attention_causal_window")
    (k,) = plan.kernels
    assert isinstance(k, AttentionKernelSm90) and k.window == 32 and k.name.endswith("_win32")
    assert any("sliding-window causal mask folded" in n.summary for n in r.notes)
    assert '"window": 32' in attention_tuning_id(p)


@pytest.mark.parametrize("arch,dtype,e", [("sm80", torch.float16, 64),
                                          ("sm90a", torch.float32, 64),
                                          ("sm90a", torch.float16, 40 * 8)])
def test_the_mask_stays_a_bias_where_the_hopper_kernel_cannot_run(arch, dtype, e):
    plan = _plan(arch, dtype=dtype, e=e)
    (r,) = plan.regions
    assert r.problem.window == 0 and r.problem.bias == "add" and r.bias is not None
    assert plan.kernels[0].config.family == "cutlass2x_sm80"


def test_window_needs_the_top_left_causal_mask():
    with pytest.raises(ValueError, match="needs causal"):
        AttentionProblem(heads=2, seq_q=8, seq_kv=8, head_dim=64, head_dim_v=64, dtype="f16",
                         scale=0.125, window=4)
    c = attention_sm90.config_for(64)
    with pytest.raises(ValueError, match="needs causal"):
        AttentionKernelSm90(arch="sm90a", dtype="f16", config=c, window=4)


def test_window_kernel_source_masks_every_tile_left_of_the_window():
    c = attention_sm90.config_for(64, order="lpt")
    src = emit_kernel(AttentionKernelSm90(arch="sm90a", dtype="f16", config=c, causal=True,
                                          window=48)).code
    assert "static constexpr int kWindow = 48;" in src
    assert "get<1>(pos) <= cute::get<0>(pos) - kWindow" in src
    assert "WindowFusion, cutlass::gemm::" in src
    plain = emit_kernel(AttentionKernelSm90(arch="sm90a", dtype="f16", config=c, causal=True)).code
    assert "WindowFusion" not in plain
    capped = emit_kernel(AttentionKernelSm90(arch="sm90a", dtype="f16", config=c, causal=True,
                                             window=48, softcap=50.0, scale=0.125)).code
    assert "struct SoftcapFusion : WindowFusion" in capped


@pytest.mark.parametrize("arch", ["sm90a", "sm80"])
def test_suite_window_cases_compute_the_reference(monkeypatch, arch):
    """Each window case is one region; its mapped call, run as the kernel reads its
    arguments (the Hopper kernel's compiled window, or the sm80 kernel's mask bias),
    matches the float64 reference."""
    cases = sliding_window_cases()
    cap = capture(SuiteModel(cases), suite_inputs(cases))
    plan = select(partition(cap.graph_module, CompileOptions(arch=arch)), arch)
    assert len(plan.regions) == len(cases) and not plan.fallbacks, plan.fallbacks
    assert all(isinstance(r, AttentionRegion) for r in plan.regions)
    windows = [r.problem.window for r in plan.regions]
    assert windows == ([48, 100, 32, 0] if arch == "sm90a" else [0] * 4)
    gm = offload(cap.graph_module, plan, library_path=None)
    log = run_emulated(monkeypatch, gm)
    model = SuiteModel(cases)
    inputs = suite_inputs(cases, seed=3)
    with torch.no_grad():
        outs = gm(*inputs)
    assert len(log) == len(cases) and all(ran for _, ran in log), [n for n, ran in log if not ran]
    bad = []
    for c, xs, out in zip(cases, model.split(inputs), outs):
        err = rel_err_nan(out, reference(c, *xs))
        if not err <= TOL[out.dtype]:
            bad.append(f"{case_id(c)}: rel err {err:.2e}")
    assert not bad, "\n".join(bad)


def test_a_dynamic_sequence_keeps_the_window_mask_as_a_bias():
    """The Hopper kernel takes static sequence lengths only: under a dynamic one the
    window mask stays the sm80 kernel's bias (checked per shape), not a fallback."""
    q = torch.randn(2, 4, 96, 64, dtype=torch.float16)
    seq = torch.export.Dim("seq", min=80, max=512)
    cap = capture(WindowSdpa(32), (q, q.clone(), q.clone()),
                  dynamic_shapes=({2: seq}, {2: seq}, {2: seq}))
    plan = select(partition(cap.graph_module, CompileOptions(arch="sm90a")), "sm90a")
    (r,) = plan.regions
    assert r.problem.window == 0 and r.problem.bias == "add" and r.problem.seq_q is None
    assert plan.kernels[0].config.family == "cutlass2x_sm80"
