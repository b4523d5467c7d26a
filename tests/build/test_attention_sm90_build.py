"""Build tier: an SD-UNet-like self-attention (head dim 40, a BSNH view) compiled for
sm_90a takes the Hopper kernel (emit/attention_sm90.py) and builds with nvcc (no GPU
needed). ONE kernel, one module-scoped build; the kernel is compiled once for the
tier, in the unit of hopper_fmha.py's build (``hopper_fmha_built``), which this build
links (the kernel index). Its host-side entry points run without a GPU:
``workspace_size`` and ``run``'s refusals read every CoAttentionArgs field the kernel
uses."""
import ctypes

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlass_offload as co
from cutlass_offload import emit
from cutlass_offload.runtime.library import (
    CO_CANNOT_IMPLEMENT,
    CO_OK,
    CoAttentionArgs,
    Library,
)

pytestmark = pytest.mark.build

B, N, S, E = 2, 8, 64, 40


class SelfAttention(nn.Module):
    """diffusers' attention processor: (B, S, N*E) projections viewed as BSNH."""

    def forward(self, q, k, v):
        q, k, v = (t.view(B, S, N, E).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, S, N * E)


@pytest.fixture(scope="module")
def hopper_attention(tmp_path_factory, cache_dir, hopper_fmha_built):
    import os
    os.environ["CUTLASS_OFFLOAD_CACHE_DIR"] = str(cache_dir)
    out = tmp_path_factory.mktemp("out") / "attention_sm90"
    x = [torch.randn(B, S, N * E, dtype=torch.float16) for _ in range(3)]
    return co.compile(SelfAttention(), tuple(x), arch="sm_90a", out_dir=out), out


def _args(ptr=1 << 20, **kw) -> CoAttentionArgs:
    a = CoAttentionArgs()
    a.q = a.k = a.v = a.out = ptr
    a.bias = None
    a.batch, a.heads, a.seq_q, a.seq_kv, a.head_dim, a.head_dim_v = B, N, S, S, E, E
    for t in ("q", "k", "v", "out"):                         # BSNH, in place
        setattr(a, f"{t}_stride_batch", S * N * E)
        setattr(a, f"{t}_stride_seq", N * E)
        setattr(a, f"{t}_stride_head", E)
    a.scale, a.causal = E ** -0.5, 0
    for name, value in kw.items():
        setattr(a, name, value)
    return a


def test_the_hopper_kernel_is_chosen_and_built(hopper_attention):
    compiled, _out = hopper_attention
    assert not compiled.plan.fallbacks and not compiled.report.build["failures"]
    (r,) = compiled.plan.regions
    assert r.form == "sdpa" and r.out_layout == "bmhk"
    (k,) = compiled.plan.distinct_kernels
    assert k.name == "cutlass3x_sm90_fmha_fwd_f16_128x64x64_s5_coop" and k.needs_workspace
    secs = [u["seconds"] for u in compiled.report.build["units"] if u["kernels"]]
    print(f"Hopper FMHA kernel TU: {max(secs):.1f} s")      # reported with -s


def test_the_hopper_kernel_unit_compiles_with_ftz(hopper_attention):
    """Its unit's nvcc command (the cache entry's meta.json) has -ftz=true, so the
    softmax's exp2f is one MUFU.EX2 (emit/attention_sm90.NVCC_FLAGS); the launchers'
    unit does not."""
    import json
    from pathlib import Path
    compiled, _out = hopper_attention
    commands = {}
    for u in compiled.report.build["units"]:
        meta = Path(u["source"]).with_name("meta.json")
        commands[bool(u["kernels"])] = json.loads(meta.read_text())["command"]
    assert "-ftz=true" in commands[True]
    assert "-ftz=true" not in commands[False]


def test_library_runs_host_checks_without_a_gpu(hopper_attention):
    compiled, out = hopper_attention
    lib = Library(out / "libcutlass_offload.so")
    assert lib.info["arch"] == "sm90a" and len(lib.info["regions"]) == 1
    run, ws = lib.launcher(emit.region_symbol(compiled.plan.regions[0].name), CoAttentionArgs)
    assert ws(ctypes.byref(_args())) == B * N * S * 4                   # fp32 log-sum-exp rows
    assert ws(ctypes.byref(_args(ptr=(1 << 20) + 8))) == 0               # not 16-byte aligned
    assert ws(ctypes.byref(_args(q_stride_head=E + 4))) == 0             # stride not 16 bytes
    assert ws(ctypes.byref(_args(head_dim=44, head_dim_v=44))) == 0      # not a multiple of 8
    assert ws(ctypes.byref(_args(head_dim=72, head_dim_v=72))) == 0      # beyond the 64 tile
    assert ws(ctypes.byref(_args(head_dim_v=32))) == 0                   # one head dim
    assert ws(ctypes.byref(_args(seq_q=20))) == B * N * 20 * 4           # any query length
    assert ws(ctypes.byref(_args(k_stride_head=0, v_stride_head=0))) == B * N * S * 4  # one K/V head
    # run refuses before any CUDA call; an empty problem is done without a launch
    for bad in ({"causal": 1}, {"causal": 3}, {"scale": -0.1}, {"bias": 1 << 20},
                {"batch": 70000}, {"seq_kv": 0}):
        assert run(ctypes.byref(_args(**bad)), None) == CO_CANNOT_IMPLEMENT, bad
    assert run(ctypes.byref(_args(batch=0)), None) == CO_OK
    assert run(ctypes.byref(_args()), None) == 2                         # CO_WORKSPACE_TOO_SMALL
