"""The sm90a GEMM family's headers (emit/gemm_sm90.py INCLUDES, KERNEL_HEADER,
TMA_EPILOGUE_INCLUDES): CUTLASS's sm90 pieces one by one, never its every-architecture
umbrella headers, which cost every unit seconds of parsing in cudafe++, cicc and the
host compiler (benchmarks/unit_headers.py); the launch goes through
templates/sm90_kernel_adapter.h instead of GemmUniversalAdapter."""
import pytest

from cutlass_offload.emit import emit_kernel, gemm_sm90, glu_sm90, staged
from cutlass_offload.ir import ConvKernel, ConvProblem, GemmEpilogue, GemmKernel
from cutlass_offload.select import sm90
from cutlass_offload.select.conv import choose_conv_kernel

UMBRELLAS = ("cutlass/gemm/collective/collective_builder.hpp", "cutlass/gemm/collective/collective_mma.hpp",
             "cutlass/gemm/kernel/gemm_universal.hpp", "cutlass/gemm/device/gemm_universal_adapter.h")
EPILOGUE_BUILDER = "cutlass/epilogue/collective/collective_builder.hpp"


def _gemm(cfg, ep=GemmEpilogue(bias=True, activation="gelu_erf"), dtype="f16"):
    return GemmKernel(arch="sm90a", dtype=dtype, layout_b="col", align_a=8, align_b=8, align_c=8,
                      epilogue=ep, config=cfg)


KERNELS = {
    "pingpong": _gemm(sm90._config((128, 128, 64), (1, 1, 1), sm90.PINGPONG)),
    "coop_cluster": _gemm(sm90._config((256, 128, 64), (2, 1, 1), sm90.COOP), GemmEpilogue(residual="add")),
    "stream_k": _gemm(sm90._config((128, 128, 64), (1, 1, 1), sm90.COOP, "stream_k"), GemmEpilogue()),
    "wide_176": _gemm(sm90._config((128, 176, 64), (1, 1, 1), sm90.COOP)),
    "n_split": _gemm(sm90._config((192, 192, 64), (1, 1, 1), sm90.COOP, n_split=True), GemmEpilogue()),
    "glu": _gemm(sm90._config((128, 128, 64), (1, 1, 1), sm90.PINGPONG), GemmEpilogue(activation="silu", glu=True)),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("form", [False, True], ids=["tma_epilogue", "staged"])
def test_no_umbrella_header_and_the_kernel_adapter(name, form, monkeypatch):
    monkeypatch.setattr(staged, "ENABLED", form)
    k = KERNELS[name]
    src = gemm_sm90.emit(k)
    assert not set(UMBRELLAS) & set(src.includes), src.includes
    assert set(gemm_sm90.INCLUDES) <= set(src.includes)
    assert gemm_sm90.KERNEL_HEADER[k.config.kernel_schedule] in src.includes
    # only the kernel schedule it runs
    assert sum(h in src.includes for h in gemm_sm90.KERNEL_HEADER.values()) == 1
    own = k.epilogue.glu or gemm_sm90.staged_epilogue_applies(k)
    assert (EPILOGUE_BUILDER in src.includes) == (not own)
    assert (set(glu_sm90.INCLUDES) <= set(src.includes)) == own
    assert "using Gemm = co_sm90::KernelAdapter<GemmKernel>;" in src.code
    assert "GemmUniversalAdapter<" not in src.code.replace("GemmUniversalAdapter does", "")
    # the adapter's text comes once per unit: guarded
    assert src.code.count("#ifndef CO_SM90_KERNEL_ADAPTER_H") == 1


def test_a_conv_lowered_onto_the_gemm_takes_the_gemms_headers():
    # a 1x1 stride-1 conv runs as the sm90 GEMM on x as it lies (families/conv_gemm_sm90.py)
    problem = ConvProblem(n=2, h=16, w=16, c=64, k=128, r=1, s=1, dtype="f16",
                          align_a=8, align_b=8, align_c=8)
    k = choose_conv_kernel(problem, "sm90a", 132)
    assert isinstance(k, ConvKernel) and k.iterator == "direct", k
    src = emit_kernel(k)
    assert not set(UMBRELLAS) & set(src.includes)
    assert "co_sm90::KernelAdapter<GemmKernel>" in src.code


def test_the_non_persistent_schedule_keeps_the_kernel_umbrella():
    # sm90_gemm_tma_warpspecialized.hpp uses IsCutlass3ArrayKernel, defined only in
    # gemm_universal.hpp (nvcc: identifier undefined without it); no selector picks it
    cfg = sm90._config((128, 128, 64), (1, 1, 1), "KernelTmaWarpSpecialized")
    src = gemm_sm90.emit(_gemm(cfg, GemmEpilogue()))
    assert "cutlass/gemm/kernel/gemm_universal.hpp" in src.includes


def test_the_adapter_reads_and_clears_the_launch_error_as_cutlass_does():
    # GemmUniversalAdapter::run ends with cudaGetLastError; a failed launch must not
    # leave its error for an unrelated later CUDA call
    run = gemm_sm90.KERNEL_ADAPTER_H.split("static cutlass::Status run(")[1]
    assert "cudaGetLastError()" in run and run.index("cudaGetLastError()") > run.index("ClusterLauncher::launch")
