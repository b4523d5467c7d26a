"""The build tier's one build of the off-by-default staged epilogue forms
(tests/build/test_staged_epilogue_build.py) and of the GLU epilogue's store forms
(tests/build/test_glu_staged_build.py): every kernel in one plan, built once per
session (conftest.py's ``staged_forms_built``). A kernel's dtype names its form:

* fp16: the staged epilogue's TMA-store form (emit/staged.STORE "tma", the form
  CUTLASS_OFFLOAD_STAGED_EPILOGUE=1 picks) and the GLU's staged row store (GLU_STAGED,
  its default);
* bf16: the staged epilogue's row-store form (STORE "rows") and the GLU's TMA store
  (GLU_TMA).

Kernels of one tile, cluster, schedule and dtype can share their mainloop's
instantiations in a unit, and every unit pays CUTLASS's headers once: on the 2-core
machine (2026-12-06, beside other work) the two test files took 290-340 s as six
units (each form built apart) and 140-210 s as this one build's two units."""
import pytest
from build_helpers import build_one_job

from cutlass_offload import emit
from cutlass_offload.emit import conv_sm90, glu_sm90, staged
from cutlass_offload.ir import (ConvKernel, ConvProblem, ConvRegion, GemmEpilogue, GemmKernel, GemmProblem,
                                GemmRegion, Plan)
from cutlass_offload.select import sm90

# the staged epilogue's kinds: (epilogue, config)
KINDS = (
    (GemmEpilogue(bias=True, activation="gelu_erf"), sm90._config((128, 128, 64), (1, 1, 1), sm90.PINGPONG)),
    (GemmEpilogue(bias=True, activation="relu", residual="add", post_activation="relu"),
     sm90._config((256, 128, 64), (1, 1, 1), sm90.COOP)),
    (GemmEpilogue(), sm90._config((128, 176, 64), (2, 1, 1), sm90.COOP)),
    (GemmEpilogue(activation="silu", residual="mul"), sm90._config((64, 128, 64), (1, 1, 1), sm90.PINGPONG)),
)
# (staged store form, the dtype of its kernels)
FORMS = (("tma", "f16"), ("rows", "bf16"))
STAGED_CLASS = {"rows": "co_staged::StagedEpilogue<", "tma": "co_staged::TmaStagedEpilogue<"}
CONV_EP = GemmEpilogue(bias=True, activation="relu", residual="add")

# the GLU's: the staged row store in fp16, the TMA store in bf16
GEGLU = GemmEpilogue(bias=True, activation="gelu_erf", glu=True)
GLU_STAGED_CONFIGS = (sm90._config((128, 128, 64), (1, 1, 1), sm90.PINGPONG),
                      sm90._config((128, 176, 64), (2, 1, 1), sm90.COOP))
GLU_TMA_CONFIGS = (sm90._config((128, 128, 64), (1, 1, 1), sm90.PINGPONG),
                   sm90._config((128, 256, 64), (1, 1, 1), sm90.COOP))
GLU_STAGED_DTYPE, GLU_TMA_DTYPE = "f16", "bf16"


def _gemm_pair(name: str, ep: GemmEpilogue, config, dtype: str, m: int, n: int, k: int) -> tuple:
    """(region, kernel) of an M x N x K GEMM with B column-major, 16-byte aligned."""
    kernel = GemmKernel(arch="sm90a", dtype=dtype, layout_b="col", align_a=8, align_b=8, align_c=8,
                        epilogue=ep, config=config)
    problem = GemmProblem(n=n, k=k, dtype=dtype, layout_b="col", align_a=8, align_b=8, align_c=8,
                          epilogue=ep, m=m, m_hint=m)
    return GemmRegion(name=name, form="linear", nodes=(name,), a="a", b="b", problem=problem), kernel


def staged_pairs(dtype: str) -> tuple:
    """(region, kernel) pairs of one staged form: the GEMM kinds, a 1x1 conv lowered onto
    the GEMM, a 3x3 implicit-GEMM (TMA) conv."""
    pairs = [_gemm_pair(f"staged_{dtype}{i}", ep, config, dtype, 4096, 1024, 320)
             for i, (ep, config) in enumerate(KINDS)]
    conv_p = ConvProblem(dtype=dtype, epilogue=CONV_EP, n_hint=2, c=64, k=64, h=16, w=16, r=1, s=1,
                         align_a=8, align_b=8, align_c=8)
    conv_k = ConvKernel(arch="sm90a", dtype=dtype, align_a=8, align_b=8, align_c=8, epilogue=CONV_EP,
                        config=KINDS[0][1], iterator="direct")
    name = f"pointwise_{dtype}"
    pairs.append((ConvRegion(name=name, nodes=(name,), x="x", w="w", bias="b", problem=conv_p), conv_k))
    tma_p = ConvProblem(dtype=dtype, epilogue=CONV_EP, n_hint=2, c=64, k=64, h=16, w=16, r=3, s=3,
                        pad=(1, 1, 1, 1), align_a=8, align_b=8, align_c=8)
    tma_k = ConvKernel(arch="sm90a", dtype=dtype, align_a=8, align_b=8, align_c=8, epilogue=CONV_EP,
                       config=conv_sm90.make_config((128, 128, 64), (2, 1, 1)), iterator="")
    name = f"conv3x3_{dtype}"
    pairs.append((ConvRegion(name=name, nodes=(name,), x="x", w="w", bias="b", problem=tma_p), tma_k))
    return tuple(pairs)


def glu_pairs(configs, dtype: str) -> tuple:
    """A GEGLU region per config (the UNet's 8192 x 2560 x 320 problem), each on its kernel."""
    return tuple(_gemm_pair(f"geglu_{dtype}{i}", GEGLU, config, dtype, 8192, 2560, 320)
                 for i, config in enumerate(configs))


def plan() -> Plan:
    pairs = (sum((staged_pairs(dtype) for _, dtype in FORMS), ())
             + glu_pairs(GLU_STAGED_CONFIGS, GLU_STAGED_DTYPE) + glu_pairs(GLU_TMA_CONFIGS, GLU_TMA_DTYPE))
    return Plan("sm90a", tuple(r for r, _ in pairs), tuple(k for _, k in pairs), ())


def build(cache_dir):
    """(plan, BuildResult): ``plan()`` built with one nvcc job, each kernel emitted in its
    dtype's forms (staged.ENABLED on; staged.STORE and glu_sm90.GLU_TMA set per kernel)."""
    store_of = {dtype: store for store, dtype in FORMS}
    real = emit.emit_kernel

    def in_its_form(kernel):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(staged, "STORE", store_of[kernel.dtype])
            m.setattr(glu_sm90, "GLU_TMA", kernel.dtype == GLU_TMA_DTYPE)
            return real(kernel)

    p = plan()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(staged, "ENABLED", True)
        m.setattr(glu_sm90, "GLU_STAGED", True)
        m.setattr(emit, "emit_kernel", in_its_form)
        return p, build_one_job(cache_dir, p)
