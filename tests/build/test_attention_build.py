"""Build tier: a model with two attentions (causal self-attention, cross-attention)
compiles into one library with nvcc (no GPU needed): ONE attention kernel (sm_80,
head dim 160: the kernel that keeps its fp32 output in the workspace) serves both.
Its host-side entry points run without a GPU: ``workspace_size`` and ``run``'s
refusals read every CoAttentionArgs field, so they check the ctypes mirror."""
import ctypes
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cutlass_offload as co
from cutlass_offload import emit
from cutlass_offload.runtime.library import CO_CANNOT_IMPLEMENT, CO_OK, CoAttentionArgs, Library

pytestmark = pytest.mark.build

B, N, S, SKV, E = 2, 4, 24, 40, 160


class TwoAttentions(nn.Module):
    def forward(self, q, k, v, kc, vc):
        h = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(h, kc, vc)


@pytest.fixture(scope="module")
def attention_model(tmp_path_factory, cache_dir):
    import os
    os.environ["CUTLASS_OFFLOAD_CACHE_DIR"] = str(cache_dir)
    out = tmp_path_factory.mktemp("out") / "attention"
    x = [torch.randn(B, N, S, E, dtype=torch.float16) for _ in range(3)]
    c = [torch.randn(B, N, SKV, E, dtype=torch.float16) for _ in range(2)]
    return co.compile(TwoAttentions(), (*x, *c), arch="sm_80", out_dir=out), out


def _args(ptr=1 << 20, **kw) -> CoAttentionArgs:
    a = CoAttentionArgs()
    a.q = a.k = a.v = a.out = ptr
    a.bias = None
    a.batch, a.heads, a.seq_q, a.seq_kv, a.head_dim, a.head_dim_v = B, N, S, SKV, E, E
    for t, seq in (("q", S), ("k", SKV), ("v", SKV)):         # (B, H, L, E) contiguous
        setattr(a, f"{t}_stride_batch", N * seq * E)
        setattr(a, f"{t}_stride_seq", E)
        setattr(a, f"{t}_stride_head", seq * E)
    a.out_stride_batch, a.out_stride_seq, a.out_stride_head = S * N * E, N * E, E
    a.scale, a.causal = 0.125, 1
    for name, value in kw.items():
        setattr(a, name, value)
    return a


def test_one_kernel_for_both_attentions(attention_model):
    compiled, out = attention_model
    assert [r.form for r in compiled.plan.regions] == ["sdpa", "sdpa"]
    assert [r.problem.causal for r in compiled.plan.regions] == ["top_left", "none"]
    assert not compiled.plan.fallbacks and not compiled.report.build["failures"]
    (k,) = compiled.plan.distinct_kernels
    assert k.name == "cutlass2x_sm80_fmha_fwd_f16_aligned_32x128_k65536_gmem" and k.needs_workspace
    units = {u["name"] for u in compiled.report.build["units"]}
    assert any(n.startswith("shard_sm80_attention_f16") for n in units), units
    text = compiled.report.format()
    assert "sdpa:causal x1" in text and "sdpa:plain x1" in text


def test_library_exports_both_regions_and_runs_host_checks_without_a_gpu(attention_model):
    compiled, out = attention_model
    lib = Library(out / "libcutlass_offload.so")
    assert lib.info["arch"] == "sm80" and len(lib.info["regions"]) == 2
    run, ws = lib.launcher(emit.region_symbol(compiled.plan.regions[0].name), CoAttentionArgs)
    assert ws(ctypes.byref(_args())) == B * S * N * E * 4           # fp32 output accumulator
    assert ws(ctypes.byref(_args(ptr=(1 << 20) + 2))) == 0          # misaligned: refused
    assert ws(ctypes.byref(_args(head_dim=164, head_dim_v=164))) == 0   # not a multiple of 8
    # run refuses before any CUDA call; an empty problem is done without a launch
    assert run(ctypes.byref(_args(causal=3)), None) == CO_CANNOT_IMPLEMENT
    assert run(ctypes.byref(_args(scale=-0.125)), None) == CO_CANNOT_IMPLEMENT
    assert run(ctypes.byref(_args(causal=2, seq_q=SKV + 1)), None) == CO_CANNOT_IMPLEMENT
    assert run(ctypes.byref(_args(out_stride_head=E + 8)), None) == CO_CANNOT_IMPLEMENT
    assert run(ctypes.byref(_args(batch=0)), None) == CO_OK
    # the workspace is needed but missing: refused before the launch
    assert run(ctypes.byref(_args()), None) == 2                    # CO_WORKSPACE_TOO_SMALL


def test_reload(attention_model):
    compiled, out = attention_model
    again, _, _ = co.load(out)
    assert [r.name for r in again.plan.regions] == [r.name for r in compiled.plan.regions]
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["fingerprint"]) == 2
