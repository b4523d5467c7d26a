"""benchmarks/unit_headers.py without nvcc: the internal-name normalization its same-PTX
check relies on, and its reconstruction of a unit on CUTLASS's umbrella headers."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import unit_headers as uh  # noqa: E402

from cutlass_offload import emit  # noqa: E402
from cutlass_offload.emit import gemm_sm90  # noqa: E402
from cutlass_offload.ir import GemmEpilogue, GemmKernel  # noqa: E402
from cutlass_offload.select import sm90  # noqa: E402


def test_internal_names_normalize_by_their_length_prefix():
    # nvcc 13's names for one symbol in two files (the hashes differ), nested and not
    a = "ld.global _ZN50_INTERNAL_7a92003f_13_staged_tma_cu_ef828dd2_112334cuda3std3__45__cpo5beginE;"
    b = "ld.global _ZN50_INTERNAL_75503094_13_staged_tma_cu_dc053359_112914cuda3std3__45__cpo5beginE;"
    assert uh.normalize_internal_names(a) == uh.normalize_internal_names(b) != a
    assert uh.normalize_internal_names(a) == "ld.global _ZNINTERNAL4cuda3std3__45__cpo5beginE;"
    c = "_ZN37_INTERNAL_d57d6acc_7_unit_cu_d589cb6039_GLOBAL__N__d57d6acc_7_unit_cu_d589cb606ignoreE"
    assert uh.normalize_internal_names(c) == "_ZNINTERNALINTERNAL6ignoreE"
    # other code is left as it is: a different instruction still differs
    assert uh.normalize_internal_names(a.replace("ld.global", "st.global")) != uh.normalize_internal_names(b)


def test_the_umbrella_unit_swaps_the_includes_and_the_adapter_only():
    k = GemmKernel(arch="sm90a", dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                   epilogue=GemmEpilogue(bias=True), config=sm90._config((128, 128, 64), (1, 1, 1), sm90.PINGPONG))
    text = emit.emit_unit([emit.emit_kernel(k)], "test").text
    family = tuple(gemm_sm90.includes(k))
    old = uh.umbrella_unit(text, family)
    assert all(f"#include <{h}>" in old for h in uh.UMBRELLA)
    assert "#include <cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized.hpp>" not in old
    assert "using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;" in old
    strip = [ln for ln in text.splitlines() if not ln.startswith("#include <cutlass/")
             and not ln.startswith("#include <cute/") and "KernelAdapter<GemmKernel>" not in ln]
    rest = [ln for ln in old.splitlines() if not ln.startswith("#include <cutlass/")
            and not ln.startswith("#include <cute/") and "GemmUniversalAdapter<GemmKernel>" not in ln]
    assert strip == rest
