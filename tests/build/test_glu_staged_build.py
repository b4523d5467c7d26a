"""Build tier: the GLU epilogue's staged store form (emit/templates/glu_epilogue.h with
Staged_ = true, emit/glu_sm90.GLU_STAGED) compiles in the two kernel schedules that
run it differently: the ping-pong kernel, whose two warp groups take turns with one
shared-memory tile and a named barrier each, and the cooperative one with a 2x1
cluster and a 176-wide tile, whose 256 threads share one barrier and whose staged
row needs no pad. The mainloop's automatic stage count carves the tile out of shared
memory; the static_asserts check the tile is sized for the CTA tile. And the TMA-store
form (GLU_TMA: templates/staged_tma_epilogue.h with Glu_) on a ping-pong and a
cooperative 128x256 tile. tests/gpu/test_glu_gemm.py runs them."""
from pathlib import Path

import pytest
from build_helpers import build_one_job, kernel_units, library_exports

from cutlass_offload.emit import glu_sm90
from cutlass_offload.ir import GemmEpilogue, GemmKernel, GemmProblem, GemmRegion, Plan
from cutlass_offload.select import sm90

pytestmark = pytest.mark.build

GEGLU = GemmEpilogue(bias=True, activation="gelu_erf", glu=True)
CONFIGS = (sm90._config((128, 128, 64), (1, 1, 1), sm90.PINGPONG),
           sm90._config((128, 176, 64), (2, 1, 1), sm90.COOP))


def _plan(configs, dtype: str) -> Plan:
    """A GEGLU region per config (the UNet's 8192 x 2560 x 320 problem), each on its kernel."""
    kernels = tuple(GemmKernel(arch="sm90a", dtype=dtype, layout_b="col", align_a=8, align_b=8, align_c=8,
                               epilogue=GEGLU, config=c) for c in configs)
    regions = tuple(GemmRegion(name=f"geglu_{dtype}{i}", form="linear", nodes=(f"geglu_{dtype}{i}",), a="a",
                               b="b", problem=GemmProblem(n=2560, k=320, dtype=dtype, layout_b="col", align_a=8,
                                                          align_b=8, align_c=8, epilogue=GEGLU, m=8192,
                                                          m_hint=8192))
                    for i in range(len(kernels)))
    return Plan("sm90a", regions, kernels, ())


def test_staged_glu_kernels_compile(cache_dir, monkeypatch):
    monkeypatch.setattr(glu_sm90, "GLU_STAGED", True)
    plan = _plan(CONFIGS, "f16")
    res = build_one_job(cache_dir, plan)
    units = kernel_units(res)
    source = "".join(Path(u.source).read_text() for u in units)
    assert source.count("TileShape, true>>") == len(CONFIGS)
    assert "TileShape, false>>" not in source
    library_exports(res, plan)


TMA_CONFIGS = (sm90._config((128, 128, 64), (1, 1, 1), sm90.PINGPONG),
               sm90._config((128, 256, 64), (1, 1, 1), sm90.COOP))


def test_tma_store_glu_kernels_compile(cache_dir, monkeypatch):
    monkeypatch.setattr(glu_sm90, "GLU_TMA", True)
    plan = _plan(TMA_CONFIGS, "bf16")
    assert all(glu_sm90.glu_tma(k) for k in plan.kernels)
    res = build_one_job(cache_dir, plan)
    source = "".join(Path(u.source).read_text() for u in kernel_units(res))
    assert source.count("co_staged::TmaStagedEpilogue<") == len(TMA_CONFIGS)
    assert "co_glu::GluEpilogue<" not in source
    library_exports(res, plan)
