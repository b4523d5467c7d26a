"""Build tier: a causal attention of several query tiles compiled for sm_90a takes the
Hopper kernel with its query tiles heaviest first (tile order "lpt":
emit/templates/fmha_lpt_scheduler.h under the example's collectives) and builds with
nvcc (no GPU needed). Its host side runs: ``workspace_size`` and ``run``'s refusals.
The kernel is compiled once for the tier, in the unit of hopper_fmha.py's build
(``hopper_fmha_built``), which this compile links (the kernel index) beside its own
launchers."""
import ctypes

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlass_offload as co
from cutlass_offload import emit
from cutlass_offload.runtime.library import CO_CANNOT_IMPLEMENT, CoAttentionArgs, Library

pytestmark = pytest.mark.build

B, N, S, E = 2, 4, 256, 64            # two query tiles of 128


class CausalAttention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _args(**kw) -> CoAttentionArgs:
    a = CoAttentionArgs()
    a.q = a.k = a.v = a.out = 1 << 20
    a.bias = None
    a.batch, a.heads, a.seq_q, a.seq_kv, a.head_dim, a.head_dim_v = B, N, S, S, E, E
    for t in ("q", "k", "v", "out"):                          # BNSH, contiguous
        setattr(a, f"{t}_stride_batch", N * S * E)
        setattr(a, f"{t}_stride_seq", E)
        setattr(a, f"{t}_stride_head", S * E)
    a.scale, a.causal = E ** -0.5, 1
    for name, value in kw.items():
        setattr(a, name, value)
    return a


def test_causal_attention_builds_heaviest_first(tmp_path, cache_dir, hopper_fmha_built):
    x = [torch.randn(B, N, S, E, dtype=torch.float16) for _ in range(3)]
    out = tmp_path / "lpt"
    compiled = co.compile(CausalAttention(), tuple(x), arch="sm_90a", out_dir=out)
    assert not compiled.plan.fallbacks and not compiled.report.build["failures"]
    (k,) = compiled.plan.distinct_kernels
    assert k.config.tile_scheduler == "lpt" and k.name.endswith("_lpt_causal"), k.name
    lib = Library(out / "libcutlass_offload.so")
    run, ws = lib.launcher(emit.region_symbol(compiled.plan.regions[0].name), CoAttentionArgs)
    assert ws(ctypes.byref(_args())) == B * N * S * 4
    assert ws(ctypes.byref(_args(seq_q=S + 1))) == 0          # top-left causal needs seq_q <= seq_kv
    for bad in ({"causal": 0}, {"causal": 2, "seq_kv": S + 8}, {"scale": -0.1}):
        assert run(ctypes.byref(_args(**bad)), None) == CO_CANNOT_IMPLEMENT, bad
