"""Build tier: the GLU epilogue's staged store form (emit/templates/glu_epilogue.h with
Staged_ = true, emit/glu_sm90.GLU_STAGED) compiles in the two kernel schedules that
run it differently: the ping-pong kernel, whose two warp groups take turns with one
shared-memory tile and a named barrier each, and the cooperative one with a 2x1
cluster and a 176-wide tile, whose 256 threads share one barrier and whose staged
row needs no pad. The mainloop's automatic stage count carves the tile out of shared
memory; the static_asserts check the tile is sized for the CTA tile. And the TMA-store
form (GLU_TMA: templates/staged_tma_epilogue.h with Glu_) on a ping-pong and a
cooperative 128x256 tile. The staged form's kernels are fp16, the TMA form's bf16, in
one build with the staged epilogue's forms (staged_forms.py).
tests/gpu/test_glu_gemm.py runs them."""
import pytest
from build_helpers import kernel_code, kernel_units, library_exports
from staged_forms import GLU_STAGED_CONFIGS, GLU_STAGED_DTYPE, GLU_TMA_CONFIGS, GLU_TMA_DTYPE

from cutlass_offload.emit import glu_sm90

pytestmark = pytest.mark.build


def _glu(plan, dtype: str) -> list:
    return [k for k in plan.kernels if k.epilogue.glu and k.dtype == dtype]


def test_staged_glu_kernels_compile(staged_forms_built):
    plan, res = staged_forms_built
    kernels = _glu(plan, GLU_STAGED_DTYPE)
    assert [k.config for k in kernels] == list(GLU_STAGED_CONFIGS)
    code = kernel_code(kernel_units(res))
    source = "".join(code[k.name] for k in kernels)
    assert source.count("TileShape, true>>") == len(GLU_STAGED_CONFIGS)
    assert "TileShape, false>>" not in source
    assert "co_staged::TmaStagedEpilogue<" not in source
    library_exports(res, plan)


def test_tma_store_glu_kernels_compile(staged_forms_built, monkeypatch):
    plan, res = staged_forms_built
    kernels = _glu(plan, GLU_TMA_DTYPE)
    assert [k.config for k in kernels] == list(GLU_TMA_CONFIGS)
    monkeypatch.setattr(glu_sm90, "GLU_TMA", True)
    assert all(glu_sm90.glu_tma(k) for k in kernels)
    code = kernel_code(kernel_units(res))
    source = "".join(code[k.name] for k in kernels)
    assert source.count("co_staged::TmaStagedEpilogue<") == len(GLU_TMA_CONFIGS)
    assert "co_glu::GluEpilogue<" not in source
    library_exports(res, plan)
