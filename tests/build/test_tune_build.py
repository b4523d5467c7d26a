"""Build tier: the sm90a config kinds the heuristic and --tune added compile: the
stream-K tile scheduler (a new template argument) and the 64x256 ping-pong tile
(the largest ping-pong accumulator), in one build the way --tune builds its
candidates: two translation units, since the persistent kernels' unit defines
CUTLASS's grid dependency control (for PDL launches) and CUTLASS 4.2's stream-K
scheduler does not compile with it (build.shards.unit_class); a final plan that
uses one of them reuses that object and compiles only launchers. (All 30 configs
of select/sm90.SPACE compiled, 43 kernels in one unit, when the space was added.)
A wave-fitted 128x176 tile rides in the persistent unit: its wgmma comes from CuTe's
extended shapes through a specialized selector (emit/sm90_parts.wgmma_selector; a
static_assert checks the builder took it) and it stores through a tile-wide epilogue
subtile (epilogue_tile), which CUTLASS's builders must accept. So does a GLU kernel of
that tile (gate and up interleaved, the product written from registers:
emit/templates/glu_epilogue.h, whose static_asserts check the accumulator layout it
reads)."""
from pathlib import Path

import pytest
from build_helpers import build_one_job, kernel_units, library_exports

from cutlass_offload import build
from cutlass_offload.ir import GemmEpilogue, GemmKernel, GemmProblem, GemmRegion, Plan
from cutlass_offload.select import sm90

pytestmark = pytest.mark.build

NEW_KINDS = ("stream_k", "wide")
FITTED_176 = sm90._config((128, 176, 64), (1, 1, 1), sm90.COOP)
EPILOGUE = GemmEpilogue(bias=True, activation="gelu_erf")
GLU = GemmEpilogue(bias=True, activation="silu", glu=True)
FITTED_176_C2 = sm90._config((128, 176, 64), (2, 1, 1), sm90.COOP)


def _plan(names, extra=(), glu=()):
    kernels = tuple((EPILOGUE, GemmKernel(arch="sm90a", dtype="f16", layout_b="col", align_a=8, align_b=8,
                                          align_c=8, epilogue=EPILOGUE, config=c))
                    for c in [sm90.CONFIGS[n] for n in names] + list(extra))
    kernels += tuple((GLU, GemmKernel(arch="sm90a", dtype="bf16", layout_b="col", align_a=8, align_b=8,
                                      align_c=8, epilogue=GLU, config=c)) for c in glu)
    regions = tuple(GemmRegion(name=f"tune0_{i}", form="linear", nodes=(f"tune0_{i}",), a="a", b="b",
                               problem=GemmProblem(n=256, k=256, dtype=k.dtype, layout_b="col", align_a=8,
                                                   align_b=8, align_c=8, epilogue=ep, m=256, m_hint=256))
                    for i, (ep, k) in enumerate(kernels))
    return Plan("sm90a", regions, tuple(k for _, k in kernels), ())


def build_candidates(cache_dir):
    """(plan, BuildResult) of the candidates' build (also run ahead: build_ahead.py)."""
    plan = _plan(NEW_KINDS, extra=(FITTED_176,), glu=(FITTED_176_C2,))
    return plan, build_one_job(cache_dir, plan)


@pytest.fixture(scope="module")
def candidates_built(cache_dir, build_ahead):
    build_ahead.wait("tune_candidates")
    return build_candidates(cache_dir)


def test_new_config_kinds_compile_in_one_unit(candidates_built):
    plan, res = candidates_built
    units = kernel_units(res)
    assert len(units) == 2
    assert sorted(k for u in units for k in u.kernels) == sorted(k.name for k in plan.kernels)
    sources = {u.kernels[0]: Path(u.source).read_text() for u in units}
    for name, source in sources.items():
        stream_k = "streamk" in name
        assert source.count("cutlass::gemm::StreamKScheduler>") == int(stream_k)
        assert ("#define CUTLASS_ENABLE_GDC_FOR_SM90" in source) != stream_k
        assert ("#include <cute/arch/mma_sm90_gmma_ext.hpp>" in source) != stream_k
        assert ("TiledMma::AtomShape_MNK{}) == 176" in source) != stream_k
        assert ("cute::Shape<cute::_128, cute::_176>," in source) != stream_k
        assert ("co_glu::GluEpilogue<" in source) != stream_k
    library_exports(res, plan)


def test_a_final_plan_reuses_the_candidate_object(candidates_built, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_JOBS", "1")
    winner = _plan(["stream_k"])
    res = build.build(winner, "sharded")
    compiled = [u for u in res.units if not u.cache_hit]
    assert [u.name for u in compiled] == ["launchers"], res.format()
