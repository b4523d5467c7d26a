"""emit/attention.py (no nvcc, no GPU): kernel choice, refusals, names, generated code."""
import re

import pytest

from cutlass_offload.emit import attention as at
from cutlass_offload.emit import emit_unit
from cutlass_offload.ir import KernelConfig


def problem(head_dim=64, head_dim_v=None, dtype="f16", **kw):
    kw.setdefault("scale", head_dim ** -0.5)
    return at.AttentionProblem(heads=kw.pop("heads", 8), seq_q=kw.pop("seq_q", None),
                               seq_kv=kw.pop("seq_kv", None), head_dim=head_dim,
                               head_dim_v=head_dim if head_dim_v is None else head_dim_v,
                               dtype=dtype, **kw)


# --- choose ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("head_dim,tile,single", [
    (8, (64, 64, 64), True), (40, (64, 64, 64), True), (64, (64, 64, 64), True),
    (80, (64, 128, 128), True), (128, (64, 128, 128), True),
    (160, (32, 128, 65536), False), (256, (32, 128, 65536), False)])
def test_choose_tile_by_head_dim(dtype, head_dim, tile, single):
    k = at.choose(problem(head_dim, dtype=dtype))
    assert tuple(k.config.tile) == tile
    assert k.config.family == "cutlass2x_sm80"
    assert k.aligned and k.access == 8
    assert k.single_value_iteration is single
    assert k.needs_workspace is (not single)
    assert k.kind == "attention" and k.args_type == "CoAttentionArgs"
    assert not k.supports_bias


def test_tile_covers_the_larger_head_dim():
    assert at.choose(problem(64, 128)).max_k == 128
    assert at.choose(problem(192, 64)).max_k == 65536


@pytest.mark.parametrize("head_dim", [36, 44, 52, 100, 132, 196, 252])
def test_multiples_of_four_use_the_not_aligned_kernel(head_dim):
    k = at.choose(problem(head_dim))
    assert not k.aligned and k.access == 4
    assert "_notaligned_" in k.name


def test_misaligned_strides_use_the_not_aligned_kernel():
    assert not at.choose(problem(64, align=4)).aligned
    with pytest.raises(ValueError, match="4 elements"):
        at.choose(problem(64, align=2))


@pytest.mark.parametrize("head_dim", [7, 9, 33, 42, 50, 66, 130, 255])
def test_head_dims_not_multiple_of_four_are_refused(head_dim):
    with pytest.raises(ValueError, match="not a multiple of 4"):
        at.choose(problem(head_dim))
    assert not at.supports(problem(head_dim))
    with pytest.raises(ValueError, match="head_dim_v=.*multiple of 4"):
        at.choose(problem(64, head_dim))


def test_f32_is_always_aligned():
    for d in (40, 36, 64, 128, 160):
        k = at.choose(problem(d, dtype="f32"))
        assert k.aligned and k.access == 4 and not k.needs_workspace
        assert k.config.stages == 3
    with pytest.raises(ValueError, match="single access width"):
        at.check(at.AttentionKernel("sm80", "f32", at.config_for("f32", (64, 64, 64)),
                                    aligned=False))


def test_bias_selects_bias_kernel_and_causal_does_not_change_the_kernel():
    plain = at.choose(problem(64))
    assert at.choose(problem(64, causal="top_left")) == plain
    assert at.choose(problem(64, causal="bottom_right")) == plain
    biased = at.choose(problem(64, bias="add", bias_broadcast=("batch", "heads")))
    assert biased.supports_bias and biased.name == plain.name + "_bias"


@pytest.mark.parametrize("arch", ["sm80", "sm90a"])
def test_arch(arch):
    assert at.choose(problem(64), arch).arch == arch
    with pytest.raises(ValueError, match="target"):
        at.choose(problem(64), "sm70")


def test_names_distinct_per_config():
    kernels = {}
    for dtype in at.DTYPES:
        for d in (40, 64, 128, 256, 36, 100, 196):
            for bias in ("none", "add"):
                k = at.choose(problem(d, dtype=dtype, bias=bias))
                kernels.setdefault(k.name, k)
                assert kernels[k.name] == k, k.name
    # f16/bf16: 3 tiles x aligned/not x bias/not; f32: 3 tiles x bias/not
    assert len(kernels) == 2 * 12 + 6
    for name in kernels:
        assert re.fullmatch(r"[A-Za-z0-9_]+", name)


def test_scale_refusals():
    assert at.supports(problem(64, scale=1e-30))
    for bad in (0.0, -0.125, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale"):
            at.choose(problem(64, scale=bad))


def test_static_shape_refusals():
    with pytest.raises(ValueError, match="bottom-right"):
        at.choose(problem(64, causal="bottom_right", seq_q=128, seq_kv=77))
    assert at.supports(problem(64, causal="bottom_right", seq_q=77, seq_kv=128))
    assert at.supports(problem(64, causal="top_left", seq_q=128, seq_kv=77))
    with pytest.raises(ValueError, match="no keys"):
        at.choose(problem(64, seq_q=4, seq_kv=0))
    with pytest.raises(ValueError, match="heads"):
        at.choose(problem(64, heads=70000))
    with pytest.raises(ValueError, match="batch"):
        at.choose(problem(64, batch=70000))
    with pytest.raises(ValueError, match="kMaxK"):
        at.choose(problem(65540))


def test_problem_validation():
    with pytest.raises(ValueError, match="keys"):
        problem(64, bias="add", bias_broadcast=("keys",))
    with pytest.raises(ValueError, match="needs a bias"):
        problem(64, bias_broadcast=("batch",))
    with pytest.raises(ValueError, match="causal"):
        problem(64, causal="lower_right")
    with pytest.raises(ValueError, match="dtype"):
        problem(64, dtype="f8")
    with pytest.raises(ValueError, match="scale"):
        problem(64, scale="0.1")
    p = problem(64, bias="add", bias_broadcast=("queries", "batch"))
    assert p.bias_broadcast == ("batch", "queries")
    assert p == problem(64, bias="add", bias_broadcast=("batch", "queries"))
    hash(p)


def test_check_refuses_foreign_configs():
    k = at.choose(problem(64))
    bad_tile = KernelConfig(family="cutlass2x_sm80", tile=(128, 64, 64), warp=(32, 32, 32),
                            instruction=(16, 8, 8), stages=4)
    with pytest.raises(ValueError, match="tile"):
        at.emit(at.AttentionKernel("sm80", "f16", bad_tile))
    bad_stages = KernelConfig(family="cutlass2x_sm80", tile=(64, 64, 64), warp=(32, 32, 32),
                              instruction=(16, 8, 8), stages=3)
    with pytest.raises(ValueError, match="stages"):
        at.emit(at.AttentionKernel("sm80", "f16", bad_stages))
    sm90 = KernelConfig(family="cutlass3x_sm90", tile=(64, 64, 64), stages=0)
    with pytest.raises(ValueError, match="family"):
        at.emit(at.AttentionKernel("sm90a", "f16", sm90))
    assert at.emit(k).name == k.name


def test_workspace_bytes():
    gmem = at.choose(problem(256))
    assert at.workspace_bytes(gmem, 2, 8, 100, 256) == 2 * 8 * 100 * 256 * 4
    assert at.workspace_bytes(at.choose(problem(64)), 2, 8, 100, 64) == 0
    assert at.workspace_bytes(at.choose(problem(256, dtype="f32")), 2, 8, 100, 256) == 0


# --- emitted code ------------------------------------------------------------

def template_args(code):
    m = re.search(r"AttentionKernel<\s*(.*?)>;", code, re.DOTALL)
    return [re.sub(r"/\*.*?\*/", "", a).strip() for a in m.group(1).split(",")]


@pytest.mark.parametrize("dtype,element", [("f16", "cutlass::half_t"),
                                           ("bf16", "cutlass::bfloat16_t"), ("f32", "float")])
@pytest.mark.parametrize("head_dim", [40, 128, 256, 36])
@pytest.mark.parametrize("bias", ["none", "add"])
def test_emitted_template_arguments(dtype, element, head_dim, bias):
    k = at.choose(problem(head_dim, dtype=dtype, bias=bias))
    src = at.emit(k)
    q, kk, mk = k.config.tile
    assert template_args(src.code) == [
        element, "cutlass::arch::Sm80", "true" if k.aligned else "false", str(q), str(kk),
        str(mk), "false", "true" if bias == "add" else "false"]
    assert src.name == k.name and src.args_type == "CoAttentionArgs"
    assert f"namespace {k.name} {{" in src.code
    assert "int64_t workspace_size(const CoAttentionArgs& args)" in src.code
    assert "int run(const CoAttentionArgs& args, cudaStream_t stream)" in src.code
    assert "co_attention_kernel<Attention><<<" in src.code
    assert "Attention::check_supported(p)" in src.code
    assert "co_opt_in_smem(co_attention_kernel<Attention>, kSmemBytes, done)" in src.code
    assert (f"kSingleValueIteration == {'true' if k.single_value_iteration else 'false'}"
            in src.code)
    assert "$" not in src.code
    assert "attention_args.h" not in src.includes      # struct CoAttentionArgs is in prelude.h
    assert "41_fused_multi_head_attention/kernel_forward.h" in src.includes


def test_causal_modes_map_onto_custom_mask_types():
    code = at.emit(at.choose(problem(64))).code
    assert "a.causal == 1   ? Attention::CausalFromTopLeft" in code
    assert "a.causal == 2 ? Attention::CausalFromBottomRight" in code
    assert at.CAUSAL_CODE == {"none": 0, "top_left": 1, "bottom_right": 2}


def test_run_checks_and_never_allocates():
    code = at.emit(at.choose(problem(256))).code
    for needle in ("CO_WORKSPACE_TOO_SMALL", "CO_CANNOT_IMPLEMENT", "prepare_smem()",
                   "CO_LAUNCH_FAILED", "kAlignV = Attention::MM1::kAlignmentB",
                   "kAlignBias = 128 / cutlass::sizeof_bits<Element>::value",
                   "a.out_stride_head != a.head_dim_v", "heads_as_queries(a)",
                   "p.logsumexp_ptr = nullptr", "p.use_dropout = false"):
        assert needle in code, needle
    assert "cudaMalloc" not in code and "new " not in code


def test_unit_with_several_kernels():
    kernels = {k.name: k for k in (
        at.choose(problem(64)), at.choose(problem(40)),
        at.choose(problem(128, dtype="bf16", bias="add", causal="bottom_right")),
        at.choose(problem(256)))}
    assert len(kernels) == 3          # head dims 40 and 64 share one kernel
    tu = emit_unit([at.emit(k) for k in kernels.values()], "attention")
    assert tu.kernels == tuple(kernels)
    assert tu.text.count("#include <41_fused_multi_head_attention/kernel_forward.h>") == 1
    assert tu.text.count("struct CoAttentionArgs {") == 1          # from the prelude
    assert tu.text.index("struct CoAttentionArgs {") < tu.text.index("const CoAttentionArgs&")


# --- ABI ---------------------------------------------------------------------

def test_include_dirs_and_compat_headers(tmp_path):
    from pathlib import Path
    (examples,) = at.extra_include_dirs()
    assert (Path(examples) / at.KERNEL_HEADER).is_file()
    for name, text in at.compat_headers().items():      # the committed stand-ins
        assert (Path(at.compat_dir()) / name).read_text() == text
    d = at.write_compat_headers(tmp_path / "compat")
    assert (Path(d) / "curand_kernel.h").is_file()
    flags = at.include_flags(d)
    assert flags[-1] == f"-Xcompiler=-idirafter,{d}"
    assert flags[:2] == ["-I", examples]
    with pytest.raises(ValueError, match="comma"):
        at.include_flags("/tmp/a,b")


def test_toolchain_compiles_with_the_attention_include_paths():
    """Every CUTLASS compile can include the attention kernel (examples/ on the -I path,
    the cuRAND stand-in after the system headers); neither path enters the cache key."""
    from cutlass_offload.build import toolchain
    cmd = toolchain.compile_command("nvcc", "sm80", "u.cu", "u.o")
    (examples,) = at.extra_include_dirs()
    assert cmd[cmd.index(examples) - 1] == "-I"
    assert f"-Xcompiler=-idirafter,{at.compat_dir()}" in cmd
    sig = toolchain.flags_signature(cmd)
    assert examples not in sig and "idirafter" not in sig and at.compat_dir() not in sig
    assert toolchain.flags_signature(toolchain.compile_command("nvcc", "sm80", "u.cu", "u.o",
                                                               cutlass=False)) == sig


def test_shard_planner_prices_attention_kernels_apart():
    from cutlass_offload.build import shards
    plain, biased = at.choose(problem(64)), at.choose(problem(64, bias="add"))
    fixed, per_kernel, per_epilogue = shards.COST["attention"]
    assert shards.estimate([plain]) == fixed + per_kernel
    assert per_epilogue == per_kernel                               # no cheap bias variant
    assert shards.estimate([plain, biased]) == fixed + 2 * per_kernel
    assert shards.plan_shards([plain, biased, at.choose(problem(256))], 2)
