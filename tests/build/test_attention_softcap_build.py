"""Build tier: the Hopper FMHA with a tanh soft-cap on its logits (Gemma 2's
``attn_logit_softcapping``; emit/attention_sm90.py's SoftcapFusion) compiles in
hopper_fmha.py's one unit, and its host checks take only calls of the scale the
fusion holds (no GPU needed: ``workspace_size`` is 0 for a call ``run`` refuses).
tests/gpu/test_softcap_attention_gpu.py runs it."""
import ctypes

import pytest
from build_helpers import attention_args as _args, kernel_code, kernel_units, library_exports

from cutlass_offload import emit
from cutlass_offload.emit import attention_sm90 as emit_a90
from cutlass_offload.runtime.library import CO_CANNOT_IMPLEMENT, CoAttentionArgs, Library

pytestmark = pytest.mark.build


def test_softcap_kernel_compiles_and_holds_its_scale(hopper_fmha_built):
    plan, res = hopper_fmha_built
    (i,) = [i for i, r in enumerate(plan.regions) if r.problem.softcap and not r.problem.window]
    region, kernel = plan.regions[i], plan.kernels[i]
    assert kernel.softcap == 50.0 and kernel.scale == 0.125 and kernel.causal
    code = kernel_code(kernel_units(res))[kernel.name]
    assert "struct SoftcapFusion : cutlass::fmha::collective::CausalFusion" in code
    assert "kCap = 50.0f" in code and f"kInner = {emit_a90._float(0.125 / 50.0)}" in code
    library_exports(res, plan)
    lib = Library(res.library)
    run, ws = lib.launcher(emit.region_symbol(region.name), CoAttentionArgs)
    p = region.problem
    assert ws(ctypes.byref(_args(p))) == p.batch * p.heads * p.seq_q * 4
    assert ws(ctypes.byref(_args(p, scale=0.12))) == 0                 # not the compiled scale
    assert run(ctypes.byref(_args(p, scale=0.12)), None) == CO_CANNOT_IMPLEMENT
    # the kernels without a soft-cap take any scale, as before
    (j,) = [j for j, r in enumerate(plan.regions) if r.name == "hd40_test"]
    q = plan.regions[j].problem
    _, ws_other = lib.launcher(emit.region_symbol("hd40_test"), CoAttentionArgs)
    assert ws_other(ctypes.byref(_args(q, scale=0.3, causal=0))) > 0
