"""Build tier: the staged elementwise epilogue (emit/templates/staged_epilogue.h, behind
emit/staged.ENABLED) compiles in one unit for the kernel kinds that run it
differently: a ping-pong kernel (a warp group's own barrier, 64- and 128-row tiles),
a cooperative 256-row one (two wgmma rows per warp group, one barrier for 256
threads) with a residual add and a post ReLU, a 176-wide tile with a 2x1 cluster
(11-group chunks, no row pad) and a plain epilogue, and a residual multiply; a 1x1
conv lowered onto the GEMM (emit/conv_gemm_sm90.py), whose nested GEMM takes the
epilogue too; and a 3x3 implicit-GEMM conv (emit/conv_sm90.py: a hierarchical
(q, p, n) M mode and NPQK strides) with a residual add, in a unit of its own. Both
store forms: STORE "tma" (templates/staged_tma_epilogue.h) on the fp16 kernels, "rows"
on the same kinds in bf16, in one build with the GLU's forms (staged_forms.py). The
static_asserts check the accumulator layout and the chunking. The form is off by
default, so no other build test compiles it; tests/gpu/test_staged_epilogue_gpu.py
runs it."""
import pytest
from build_helpers import kernel_code, kernel_units, library_exports
from staged_forms import FORMS, KINDS, STAGED_CLASS

from cutlass_offload.emit import conv_sm90, gemm_sm90, staged

pytestmark = pytest.mark.build


def _tma_conv(k) -> bool:
    return k.kind == "conv2d_fprop" and not k.iterator


@pytest.mark.parametrize("store,dtype", FORMS)
def test_staged_epilogue_kernels_compile(staged_forms_built, monkeypatch, store, dtype):
    plan, res = staged_forms_built
    monkeypatch.setattr(staged, "ENABLED", True)
    monkeypatch.setattr(staged, "STORE", store)
    mine = [k for k in plan.kernels if k.dtype == dtype and not k.epilogue.glu]
    assert len(mine) == len(KINDS) + 2
    assert all(gemm_sm90.staged_epilogue_applies(k) for k in mine if k.kind == "gemm")
    assert all(conv_sm90.staged_epilogue_applies(k) for k in mine if _tma_conv(k))
    units = kernel_units(res)
    # the GEMMs and the lowered convs share a unit (build.shards.unit_class "common");
    # the TMA convs have theirs ("conv3x"): two units (unless the planner's memory
    # estimate, about 14 GiB for the first, cuts it)
    tma_convs = {k.name for k in plan.kernels if _tma_conv(k)}
    assert all(set(u.kernels) <= tma_convs or not set(u.kernels) & tma_convs for u in units)
    unit_of = {name: u for u in units for name in u.kernels}
    for conv in (k for k in mine if k.kind == "conv2d_fprop" and k.iterator):
        assert any(k.kind == "gemm" and k.name in unit_of[conv.name].kernels for k in plan.kernels), conv.name
    code = kernel_code(units)
    source = "".join(code[k.name] for k in mine)
    # the 176-wide tile goes out in 16-column chunks in the TMA form
    assert source.count(STAGED_CLASS[store]) == len(KINDS) + 2
    assert all(code[k.name].count(STAGED_CLASS[store]) == 1 for k in mine)
    other = next(c for s, c in STAGED_CLASS.items() if s != store)
    assert other not in source
    assert "epilogue::collective::CollectiveBuilder" not in source     # no TMA epilogue
    library_exports(res, plan)
