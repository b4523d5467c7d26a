"""Build tier: both convs lowered onto the sm90 GEMM (emit/conv_gemm_sm90.py) compile
for sm_90a with nvcc (no GPU needed) into one library, beside a plain GEMM of the
same config: one translation unit (they share the GEMM's CUTLASS instantiations,
and none of them is a 3.x conv kernel: build.shards.unit_class), each region's
launcher and workspace query exported. tests/gpu/test_conv_conformance.py and
test_conv_properties.py run them."""
import ctypes

import pytest
from build_helpers import build_one_job, kernel_units, library_exports

from cutlass_offload import emit
from cutlass_offload.ir import (ConvKernel, ConvProblem, ConvRegion, GemmEpilogue, GemmKernel,
                                GemmProblem, GemmRegion, Plan)
from cutlass_offload.select import sm90

pytestmark = pytest.mark.build

EP = GemmEpilogue(bias=True, activation="relu")
CONFIG = sm90.CONFIGS["narrow"]


def _conv(name, iterator, **kw):
    problem = ConvProblem(dtype="f16", epilogue=EP, n_hint=2, **kw)
    kernel = ConvKernel(arch="sm90a", dtype="f16", align_a=problem.align_a, align_b=problem.align_b,
                        align_c=8, epilogue=EP, config=CONFIG, iterator=iterator)
    return ConvRegion(name=name, nodes=(name,), x="x", w="w", bias="b", problem=problem), kernel


def build_lowered(cache_dir):
    """(plan, BuildResult) of the two lowered convs and the GEMM (also run ahead:
    build_ahead.py)."""
    stem = _conv("stem", "im2col", c=3, k=64, h=32, w=32, r=7, s=7, pad=(3, 3, 3, 3),
                 stride=(2, 2), align_a=1, align_b=1, align_c=8)
    pointwise = _conv("pointwise", "direct", c=64, k=64, h=16, w=16, r=1, s=1, align_a=8,
                      align_b=8, align_c=8)
    gp = GemmProblem(n=64, k=64, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                     epilogue=EP, m=256, m_hint=256)
    linear = (GemmRegion(name="linear", form="linear", nodes=("linear",), a="a", b="b", problem=gp),
              GemmKernel(arch="sm90a", dtype="f16", layout_b="col", align_a=8, align_b=8,
                         align_c=8, epilogue=EP, config=CONFIG))
    pairs = (stem, pointwise, linear)
    plan = Plan("sm90a", tuple(r for r, _ in pairs), tuple(k for _, k in pairs), ())
    return plan, build_one_job(cache_dir, plan)


@pytest.fixture(scope="module")
def built(cache_dir, build_ahead):
    build_ahead.wait("conv_gemm")
    return build_lowered(cache_dir)


def test_lowered_convs_compile_with_the_gemm_in_one_unit(built):
    plan, res = built
    units = kernel_units(res)
    assert len(units) == 1
    assert sorted(units[0].kernels) == sorted(k.name for k in plan.kernels)
    library_exports(res, plan)


def test_workspace_query_without_a_gpu(built):
    """The conv ABI's workspace query is host code: the im2col matrix (one chunk of
    rows, Kp = 7*7*3 rounded up to 152) plus the packed filter; none for direct
    beyond the GEMM's own (a persistent GEMM's: small)."""
    plan, res = built
    from cutlass_offload.runtime.library import CoConvArgs
    lib = ctypes.CDLL(str(res.library))
    query = getattr(lib, emit.region_symbol("stem") + emit.WORKSPACE_SUFFIX)
    query.restype, query.argtypes = ctypes.c_int64, [ctypes.POINTER(CoConvArgs)]
    a = CoConvArgs(n=2, h=32, w=32, c=3, k=64, r=7, s=7, p=16, q=16, pad_h=3, pad_w=3,
                   stride_h=2, stride_w=2, dilation_h=1, dilation_w=1)
    im2col = 2 * 16 * 16 * 152 * 2
    packed_filter = 64 * 152 * 2
    need = query(ctypes.byref(a))
    assert im2col + packed_filter <= need < im2col + packed_filter + 2 * 256 + (1 << 16)
    a.c = 0                                              # refused: no workspace
    assert query(ctypes.byref(a)) == 0
    direct = getattr(lib, emit.region_symbol("pointwise") + emit.WORKSPACE_SUFFIX)
    direct.restype, direct.argtypes = ctypes.c_int64, [ctypes.POINTER(CoConvArgs)]
    d = CoConvArgs(n=2, h=16, w=16, c=64, k=64, r=1, s=1, p=16, q=16, stride_h=1, stride_w=1,
                   dilation_h=1, dilation_w=1)
    assert 0 <= direct(ctypes.byref(d)) < (1 << 16)
