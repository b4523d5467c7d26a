"""The CuTe DSL GEMM's configuration checks and C ABI shim (emit/dsl_gemm_sm90.py;
no DSL, nvcc or GPU needed: tests/build/test_dsl_gemm_build.py compiles and links)."""
import pytest

from cutlass_offload.emit import dsl_gemm_sm90 as dsl


def test_refused_configurations():
    with pytest.raises(ValueError, match="tile"):
        dsl.check((96, 128), (1, 1), "f16", "identity", "none")
    with pytest.raises(ValueError, match="activation"):
        dsl.check((128, 128), (1, 1), "f16", "tanh", "none")
    with pytest.raises(ValueError, match="dtype"):
        dsl.check((128, 128), (1, 1), "f32", "identity", "none")


def test_shim_passes_only_the_operands_the_epilogue_reads():
    plain = dsl.shim("k", "p", False, "none")
    assert "const_cast<void*>(args.d), {n}}" in plain and "args.bias != nullptr" not in plain
    fused = dsl.shim("k", "p", True, "add")
    assert "args.bias != nullptr" in fused and "args.ldc, args.batch_stride_c" in fused
