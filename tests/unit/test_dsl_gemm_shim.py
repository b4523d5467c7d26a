"""The CuTe DSL GEMM's configuration checks and C ABI shim (emit/dsl_gemm_sm90.py;
no DSL, nvcc or GPU needed: tests/build/test_dsl_gemm_build.py compiles and links)."""
import pytest

from cutlass_offload.emit import dsl_gemm_sm90 as dsl
from cutlass_offload.emit import dsl_shim


def test_refused_configurations():
    with pytest.raises(ValueError, match="tile"):
        dsl.check((96, 128), (1, 1), "f16", "identity", "none")
    with pytest.raises(ValueError, match="activation"):
        dsl.check((128, 128), (1, 1), "f16", "tanh", "none")
    with pytest.raises(ValueError, match="dtype"):
        dsl.check((128, 128), (1, 1), "f32", "identity", "none")


def test_shim_passes_only_the_operands_the_epilogue_reads():
    plain = dsl_shim.shim("k", "p", False, "none")
    assert "const_cast<void*>(args.d), {n}}" in plain and "args.bias != nullptr" not in plain
    fused = dsl_shim.shim("k", "p", True, "add")
    assert "args.bias != nullptr" in fused and "args.ldc, args.batch_stride_c" in fused


def test_config_names_are_distinct_c_identifiers():
    a = dsl.DslGemmConfig((128, 128), (1, 1), "f16")
    b = dsl.DslGemmConfig((128, 128), (2, 1), "f16", "gelu_erf", True, "add", True)
    assert a.name == "dsl_gemm_128x128_1x1_f16_plain"
    assert b.name == "dsl_gemm_128x128_2x1_f16_bias_gelu_erf_resadd_relu"
    assert a.name.isidentifier() and b.name.isidentifier() and a != b
    with pytest.raises(ValueError, match="tile"):
        dsl.DslGemmConfig((96, 128))


def test_problems_the_kernel_does_not_run_get_a_reason():
    from cutlass_offload.ir import GemmEpilogue, GemmProblem
    ok = GemmProblem(n=768, k=768, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                     m=512, epilogue=GemmEpilogue(bias=True, activation="gelu_erf"))
    assert dsl.unsupported(ok) is None
    c = dsl.config_for(ok, (128, 256), (2, 1))
    assert (c.bias, c.activation, c.cluster) == (True, "gelu_erf", (2, 1))
    row_b = GemmProblem(n=768, k=768, dtype="f16", layout_b="row", align_a=8, align_b=8, align_c=8)
    assert "layouts" in dsl.unsupported(row_b)
    odd = GemmProblem(n=770, k=768, dtype="f16", layout_b="col", align_a=8, align_b=2, align_c=2)
    assert "aligned" in dsl.unsupported(odd)
    with pytest.raises(ValueError, match="does not run"):
        dsl.config_for(odd, (128, 128))


def test_gated_configs_take_an_activation_alone_and_read_twice_the_rows_of_b():
    g = dsl.DslGemmConfig((128, 256), (2, 1), "f16", "silu", gated=True)
    assert g.name == "dsl_gemm_128x256_2x1_f16_gated_silu"
    for bad in ({"activation": "identity"}, {"bias": True}, {"residual": "add"}, {"post_relu": True}):
        with pytest.raises(ValueError, match="gated"):
            dsl.DslGemmConfig((128, 128), (1, 1), "f16", **{"activation": "silu", **bad}, gated=True)
    assert "{2 * n, k, l}" in dsl_shim.shim("k", "p", False, "none", gated=True)
    assert "{n, k, l}" in dsl_shim.shim("k", "p", False, "none")


def test_a_failed_compile_is_reported_per_config_and_never_linked(tmp_path, monkeypatch):
    from cutlass_offload.build import dsl as dsl_build
    ok, bad = dsl.DslGemmConfig((128, 128)), dsl.DslGemmConfig((64, 64))

    def fake_compile(config, num_sms=132):
        if config == bad:
            raise RuntimeError("the DSL refused it")
        return config

    def fake_export(compiled, out_dir, prefix):
        (tmp_path / f"{prefix}.o").write_bytes(b"")
        (tmp_path / f"{prefix}.h").write_text("")
    monkeypatch.setattr(dsl, "compile_config", fake_compile)
    monkeypatch.setattr(dsl, "export", fake_export)
    got = dsl_build.compile_objects([ok, bad, ok], tmp_path, jobs=1)
    assert set(got) == {ok.name, bad.name}
    assert isinstance(got[bad.name], RuntimeError) and isinstance(got[ok.name], float)
    with pytest.raises(FileNotFoundError, match="not compiled|nvcc"):
        dsl_build.link_library(tmp_path, [ok, bad])
