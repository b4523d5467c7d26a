"""Build tier: grouped-query attention with K and V read in place compiles on both
attention kernels (no GPU needed): the Hopper FMHA's co_fmha::GqaMainloop
(templates/fmha_gqa_mainloop.h) in hopper_fmha.py's unit, and the sm80 kernel with a
bias (a model's sm_80 build). Their host checks take calls whose query heads are whole
groups of the compiled G and refuse the others (``workspace_size`` is 0 for a call
``run`` refuses). tests/gpu/test_gqa_attention_gpu.py runs them."""
import ctypes

import pytest
import torch
import torch.nn.functional as F
from build_helpers import attention_args as _args, kernel_code, kernel_units, library_exports

import cutlass_offload as co
from attention_models import repeat_kv
from cutlass_offload import emit
from cutlass_offload.partition import kv_groups
from cutlass_offload.runtime.library import CO_CANNOT_IMPLEMENT, CoAttentionArgs, Library

pytestmark = pytest.mark.build


def test_hopper_gqa_kernel_compiles_and_takes_whole_groups(hopper_fmha_built):
    plan, res = hopper_fmha_built
    (i,) = [i for i, r in enumerate(plan.regions) if r.problem.kv_group > 1 and not r.problem.window]
    region, kernel = plan.regions[i], plan.kernels[i]
    assert kernel.kv_group == 4 and kernel.name.endswith("_gqa4")
    code = kernel_code(kernel_units(res))[kernel.name]
    assert "co_fmha::GqaMainloop<typename Builder::CollectiveMainloop, kKvGroup>" in code
    library_exports(res, plan)
    lib = Library(res.library)
    run, ws = lib.launcher(emit.region_symbol(region.name), CoAttentionArgs)
    p = region.problem
    assert ws(ctypes.byref(_args(p))) == p.batch * p.heads * p.seq_q * 4
    assert ws(ctypes.byref(_args(p, heads=6))) == 0                    # not whole groups of 4
    assert run(ctypes.byref(_args(p, heads=6)), None) == CO_CANNOT_IMPLEMENT


class BiasedGqa(torch.nn.Module):
    def forward(self, q, k, v, bias):
        return F.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), attn_mask=bias)


def test_sm80_gqa_kernel_compiles_and_takes_whole_groups(tmp_path, cache_dir, monkeypatch):
    """The sm80 kernel (gmem variant: head dim 160) with a bias and 4 query heads per
    K/V head."""
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(cache_dir))
    monkeypatch.setattr(kv_groups, "GQA_IN_PLACE", True)     # whatever the default
    B, H, L, D = 2, 8, 24, 160
    xs = (torch.randn(B, H, L, D).half(), torch.randn(B, H // 4, L, D).half(),
          torch.randn(B, H // 4, L, D).half(), torch.randn(B, H, L, L).half())
    m = co.compile(BiasedGqa(), xs, arch="sm_80", out_dir=tmp_path / "gqa")
    (region,) = m.plan.regions
    (kernel,) = m.plan.distinct_kernels
    assert region.problem.kv_group == 4 and kernel.kv_group == 4 and kernel.supports_bias
    lib = Library(tmp_path / "gqa" / "libcutlass_offload.so")
    _, ws = lib.launcher(emit.region_symbol(region.name), CoAttentionArgs)
    p = region.problem
    bias = dict(bias=1 << 21, bias_stride_batch=H * L * L, bias_stride_head=L * L,
                bias_stride_query=L, bias_kv_capacity=L)
    assert ws(ctypes.byref(_args(p, **bias))) > 0                      # the fp32 accumulator
    assert ws(ctypes.byref(_args(p, heads=6, **bias))) == 0
