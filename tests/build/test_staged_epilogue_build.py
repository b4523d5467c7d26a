"""Build tier: the staged elementwise epilogue (emit/templates/staged_epilogue.h, behind
emit/staged.ENABLED) compiles in one unit for the kernel kinds that run it
differently: a ping-pong kernel (a warp group's own barrier, 64- and 128-row tiles),
a cooperative 256-row one (two wgmma rows per warp group, one barrier for 256
threads) with a residual add and a post ReLU, a 176-wide tile with a 2x1 cluster
(11-group chunks, no row pad) and a plain epilogue, and a residual multiply; a 1x1
conv lowered onto the GEMM (emit/conv_gemm_sm90.py), whose nested GEMM takes the
epilogue too; and a 3x3 implicit-GEMM conv (emit/conv_sm90.py: a hierarchical
(q, p, n) M mode and NPQK strides) with a residual add, in a unit of its own. Both
store forms (STORE "rows" and "tma", templates/staged_tma_epilogue.h). The static_asserts check the accumulator layout and the chunking. The form is off by
default, so no other build test compiles it; tests/gpu/test_staged_epilogue_gpu.py runs it."""
from pathlib import Path

import pytest
from build_helpers import build_one_job, kernel_units, library_exports

from cutlass_offload.emit import conv_sm90, gemm_sm90, staged
from cutlass_offload.ir import (ConvKernel, ConvProblem, ConvRegion, GemmEpilogue, GemmKernel, GemmProblem,
                                GemmRegion, Plan)
from cutlass_offload.select import sm90

pytestmark = pytest.mark.build

KINDS = (
    (GemmEpilogue(bias=True, activation="gelu_erf"), sm90._config((128, 128, 64), (1, 1, 1), sm90.PINGPONG)),
    (GemmEpilogue(bias=True, activation="relu", residual="add", post_activation="relu"),
     sm90._config((256, 128, 64), (1, 1, 1), sm90.COOP)),
    (GemmEpilogue(), sm90._config((128, 176, 64), (2, 1, 1), sm90.COOP)),
    (GemmEpilogue(activation="silu", residual="mul"), sm90._config((64, 128, 64), (1, 1, 1), sm90.PINGPONG)),
)


@pytest.mark.parametrize("store", ["rows", "tma"])
def test_staged_epilogue_kernels_compile(cache_dir, monkeypatch, store):
    monkeypatch.setattr(staged, "ENABLED", True)
    monkeypatch.setattr(staged, "STORE", store)
    kernels = tuple(GemmKernel(arch="sm90a", dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                               epilogue=ep, config=c) for ep, c in KINDS)
    assert all(gemm_sm90.staged_epilogue_applies(k) for k in kernels)
    regions = tuple(GemmRegion(name=f"staged{i}", form="linear", nodes=(f"staged{i}",), a="a", b="b",
                               problem=GemmProblem(n=1024, k=320, dtype="f16", layout_b="col", align_a=8,
                                                   align_b=8, align_c=8, epilogue=k.epilogue, m=4096,
                                                   m_hint=4096))
                    for i, k in enumerate(kernels))
    conv_ep = GemmEpilogue(bias=True, activation="relu", residual="add")
    conv_p = ConvProblem(dtype="f16", epilogue=conv_ep, n_hint=2, c=64, k=64, h=16, w=16, r=1, s=1,
                         align_a=8, align_b=8, align_c=8)
    conv_k = ConvKernel(arch="sm90a", dtype="f16", align_a=8, align_b=8, align_c=8, epilogue=conv_ep,
                        config=KINDS[0][1], iterator="direct")
    conv = ConvRegion(name="pointwise", nodes=("pointwise",), x="x", w="w", bias="b", problem=conv_p)
    tma_p = ConvProblem(dtype="f16", epilogue=conv_ep, n_hint=2, c=64, k=64, h=16, w=16, r=3, s=3,
                        pad=(1, 1, 1, 1), align_a=8, align_b=8, align_c=8)
    tma_k = ConvKernel(arch="sm90a", dtype="f16", align_a=8, align_b=8, align_c=8, epilogue=conv_ep,
                       config=conv_sm90.make_config((128, 128, 64), (2, 1, 1)), iterator="")
    assert conv_sm90.staged_epilogue_applies(tma_k)
    tma_conv = ConvRegion(name="conv3x3", nodes=("conv3x3",), x="x", w="w", bias="b", problem=tma_p)
    plan = Plan("sm90a", regions + (conv, tma_conv), kernels + (conv_k, tma_k), ())
    res = build_one_job(cache_dir, plan)
    units = kernel_units(res)
    assert len(units) == 2           # the GEMMs and the lowered conv; the TMA conv
    source = "".join(Path(u.source).read_text() for u in units)
    # the 176-wide tile goes out in 16-column chunks in the TMA form
    cls = "co_staged::StagedEpilogue<" if store == "rows" else "co_staged::TmaStagedEpilogue<"
    assert source.count(cls) == len(KINDS) + 2
    assert "epilogue::collective::CollectiveBuilder" not in source     # no TMA epilogue
    library_exports(res, plan)
