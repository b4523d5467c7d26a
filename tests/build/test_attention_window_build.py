"""Build tier: the Hopper FMHA with a sliding window (transformers' ``sliding_window``)
composed with a soft-cap and grouped K/V heads, Gemma 2's sliding layer, compiles in
hopper_fmha.py's unit (no GPU needed); its host checks take top-left causal calls and
refuse the others. tests/gpu/test_sliding_window_gpu.py runs it."""
import ctypes

import pytest
from build_helpers import attention_args as _args, kernel_code, kernel_units, library_exports

from cutlass_offload import emit
from cutlass_offload.runtime.library import CO_CANNOT_IMPLEMENT, CoAttentionArgs, Library

pytestmark = pytest.mark.build


def test_hopper_window_kernel_compiles_and_takes_causal_calls(hopper_fmha_built):
    plan, res = hopper_fmha_built
    (i,) = [i for i, r in enumerate(plan.regions) if r.problem.window]
    region, kernel = plan.regions[i], plan.kernels[i]
    assert (kernel.window, kernel.softcap, kernel.kv_group) == (128, 50.0, 2)
    assert kernel.name.endswith("_gqa2_win128")
    code = kernel_code(kernel_units(res))[kernel.name]
    assert "static constexpr int kWindow = 128;" in code
    assert "struct SoftcapFusion : WindowFusion" in code
    library_exports(res, plan)
    lib = Library(res.library)
    run, ws = lib.launcher(emit.region_symbol(region.name), CoAttentionArgs)
    p = region.problem
    assert ws(ctypes.byref(_args(p))) == p.batch * p.heads * p.seq_q * 4
    assert ws(ctypes.byref(_args(p, causal=0))) == 0            # the window is on the causal mask
    assert run(ctypes.byref(_args(p, causal=0)), None) == CO_CANNOT_IMPLEMENT
