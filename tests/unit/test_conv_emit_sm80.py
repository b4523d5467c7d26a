"""conv_sm80 emission (no nvcc): configs, iterator choice, refusals, generated code."""
import pytest

from cutlass_offload.emit import conv_sm80, emit_unit
from cutlass_offload.ir import ConvKernel, GemmEpilogue, KernelConfig

ACTS = ("identity", "relu", "gelu_erf", "gelu_tanh", "silu", "sigmoid")
T = "cutlass::epilogue::thread::"
FUNCTOR = {"identity": T + "Identity", "relu": T + "ReLu", "gelu_erf": "co_act::GELU",
           "gelu_tanh": T + "GELU_taylor", "silu": "co_act::SiLU", "sigmoid": "co_act::Sigmoid"}


def kernel(dtype="f16", align=8, align_c=8, epilogue=GemmEpilogue(), config=None,
           iterator="optimized", stride_support="strided"):
    config = config or conv_sm80.legal_configs(dtype, align, align, align_c)[0]
    return ConvKernel("sm80", dtype, align, align, align_c, epilogue, config,
                      iterator=iterator, stride_support=stride_support)


# --- legal_configs -----------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("align", [8, 4, 2, 1])
def test_legal_configs_exist_and_emit(dtype, align):
    configs = conv_sm80.legal_configs(dtype, align, align, align)
    assert configs
    areas = [c.tile[0] * c.tile[1] for c in configs]
    assert areas == sorted(areas, reverse=True)
    for cfg in configs:
        assert cfg.family == "cutlass2x_sm80"
        assert tuple(cfg.instruction) == (16, 8, 16)
        conv_sm80.check(kernel(dtype, align, align, config=cfg,
                               iterator=conv_sm80.choose_iterator(dtype, 8 * align + align, align)))


def test_align_one_gets_two_stage_configs_only():
    assert {c.stages for c in conv_sm80.legal_configs("f16", 1, 1, 8)} == {2}
    assert min(c.stages for c in conv_sm80.legal_configs("f16", 2, 2, 8)) >= 3


def test_tf32_configs():
    configs = conv_sm80.legal_configs("f32", 4, 4, 4)
    assert configs and all(c.stages >= 3 and tuple(c.instruction) == (16, 8, 8) for c in configs)
    src = conv_sm80.emit(kernel("f32", 4, 4, config=configs[0]))
    assert "using ElementA = float;" in src.code


@pytest.mark.parametrize("dtype, align", [("f16", 16), ("f16", 3), ("f32", 8), ("f64", 1)])
def test_legal_configs_refuse_bad_dtype_or_alignment(dtype, align):
    with pytest.raises(ValueError):
        conv_sm80.legal_configs(dtype, align, align, 8 if dtype != "f32" else 4)


# --- choose_iterator ---------------------------------------------------------

@pytest.mark.parametrize("c, align, expected", [
    (3, 1, "few_channels"),
    (4, 4, "fixed_channels"),
    (9, 1, "few_channels"),
    (16, 8, "optimized"),
    (64, 8, "optimized"),
    (6, 2, "few_channels"),
    (8, 8, "fixed_channels"),
    (17, 1, "analytic"),     # odd C >= 16: no cp.async-able access
    (18, 2, "optimized"),
])
def test_choose_iterator(c, align, expected):
    assert conv_sm80.choose_iterator("f16", c, align) == expected
    assert conv_sm80.choose_iterator("bf16", c, align) == expected


def test_choose_iterator_refuses_non_dividing_alignment():
    with pytest.raises(ValueError):
        conv_sm80.choose_iterator("f16", 3, 2)


@pytest.mark.parametrize("c, align", [(3, 1), (9, 1), (4, 4), (16, 8), (64, 8), (17, 1)])
def test_chosen_iterator_is_legal_with_every_config(c, align):
    it = conv_sm80.choose_iterator("f16", c, align)
    for cfg in conv_sm80.legal_configs("f16", align, align, 8):
        src = conv_sm80.emit(kernel("f16", align, 8, config=cfg, iterator=it))
        assert f"IteratorAlgorithm::{conv_sm80._ITERATOR[it]}" in src.code


# --- refusals ----------------------------------------------------------------

def _cfg(stages, tile=(128, 128, 32), warp=(64, 64, 32), inst=(16, 8, 16)):
    return KernelConfig("cutlass2x_sm80", tile, stages, warp=warp, instruction=inst)


@pytest.mark.parametrize("k", [
    # align 1 (2-byte accesses) cannot use the cp.async multistage mainloop
    lambda: kernel("f16", 1, config=_cfg(3), iterator="analytic"),
    # TF32 needs stages >= 3
    lambda: kernel("f32", 4, 4, config=_cfg(2, inst=(16, 8, 8))),
    # wrong instruction shape for the dtype
    lambda: kernel("f16", 8, config=_cfg(3, inst=(16, 8, 8))),
    # warp does not tile the threadblock
    lambda: kernel("f16", 8, config=_cfg(3, warp=(48, 64, 32))),
    # shared memory over the sm_80 limit
    lambda: kernel("f16", 8, config=_cfg(6, tile=(256, 256, 64), warp=(64, 128, 64))),
    # 3.x family
    lambda: ConvKernel("sm90a", "f16", 8, 8, 8, GemmEpilogue(),
                       KernelConfig("cutlass3x_sm90", (128, 128, 64), 0), iterator=""),
    # non-f32 accumulation
    lambda: ConvKernel("sm80", "f16", 8, 8, 8, GemmEpilogue(), _cfg(3), accumulate="f16"),
])
def test_emit_refuses_illegal_kernels(k):
    with pytest.raises(ValueError):
        conv_sm80.emit(k())


def test_fixed_channels_needs_equal_operand_alignments():
    k = ConvKernel("sm80", "f16", 4, 2, 8, GemmEpilogue(), _cfg(3), iterator="fixed_channels")
    with pytest.raises(ValueError):
        conv_sm80.emit(k)


# --- generated code ----------------------------------------------------------

@pytest.mark.parametrize("act", ACTS)
def test_plain_epilogue_functors(act):
    src = conv_sm80.emit(kernel(epilogue=GemmEpilogue(bias=True, activation=act)))
    code = src.code
    assert src.name in code and src.args_type == "CoConvArgs"
    assert f"namespace {src.name} {{" in code
    assert "int64_t workspace_size(const CoConvArgs& args)" in code
    assert "int run(const CoConvArgs& args, cudaStream_t stream)" in code
    assert "LinearCombinationGeneric<\n    RoundedActivation," in code
    assert f"{FUNCTOR[act]}<Fragment> act;" in code
    assert "ScaleType::NoBetaScaling" in code
    assert "ref<ElementOutput>(args.bias, broadcast_layout())" in code
    assert "DefaultConv2dFprop<" in code and "ImplicitGemmConvolution<Kernel>" in code
    assert "cutlass/conv/kernel/default_conv2d_fprop.h" in src.includes
    heavy = act in ("gelu_erf", "gelu_tanh", "silu", "sigmoid")
    assert ("true>;" in code) == heavy
    assert f"kIsHeavy = {str(heavy).lower()};" in code


def test_no_bias_reads_no_source():
    code = conv_sm80.emit(kernel()).code
    assert "ScaleType::OnlyAlphaScaling" in code
    assert "ref<ElementOutput>(nullptr, broadcast_layout())" in code
    assert "ElementCompute(0)" in code
    assert "a.bias" not in code


@pytest.mark.parametrize("op, binary", [("add", "plus"), ("mul", "multiplies")])
@pytest.mark.parametrize("broadcast", [False, True])
def test_residual_epilogue(op, binary, broadcast):
    ep = GemmEpilogue(bias=True, activation="silu", residual=op, post_activation="relu",
                      residual_broadcast=broadcast)
    src = conv_sm80.emit(kernel(epilogue=ep))
    code = src.code
    assert "DefaultConv2dFpropWithBroadcast<" in code
    assert "cutlass/conv/kernel/default_conv2d_fprop_with_broadcast.h" in src.includes
    assert (f"LinearCombinationResidualBlock<\n    ElementOutput, ElementAccumulator, "
            f"ElementCompute, ElementOutput, kAlignC,\n    RoundedActivation, "
            f"cutlass::{binary}, cutlass::epilogue::thread::ReLu>") in code
    assert "co_act::SiLU<Fragment> act;" in code
    assert "/*ptr_Vector=*/const_cast<void*>(args.bias)" in code
    layout = "broadcast_layout()" if broadcast else "Layout::packed(ps.output_extent())"
    assert f"ref<ElementOutput>(args.residual, {layout})" in code
    assert "a.residual == nullptr" in code


@pytest.mark.parametrize("it", ["few_channels", "fixed_channels", "analytic"])
def test_residual_kernel_counts_k_iterations_with_its_iterator(it):
    # ImplicitGemmConvolutionWithFusedEpilogue would count them as analytic.
    ep = GemmEpilogue(bias=True, residual="add", post_activation="relu")
    code = conv_sm80.emit(kernel("f16", 4, epilogue=ep, iterator=it)).code
    assert "struct Kernel : FusedKernel {" in code
    assert "args.problem_size, kIterator);" in code
    assert f"IteratorAlgorithm::{conv_sm80._ITERATOR[it]};" in code


def test_legal_configs_take_the_iterator():
    for it in ("optimized", "analytic", "few_channels", "fixed_channels"):
        assert conv_sm80.legal_configs("f16", 8, 8, 8, it) == conv_sm80.legal_configs("f16", 8, 8, 8)
    with pytest.raises(ValueError):
        conv_sm80.legal_configs("f16", 8, 8, 8, "implicit")


def test_residual_without_bias_passes_null_vector():
    code = conv_sm80.emit(kernel(epilogue=GemmEpilogue(residual="add"))).code
    assert "/*ptr_Vector=*/nullptr" in code
    assert "a.bias" not in code


def test_problem_size_takes_explicit_p_q_and_cross_correlation():
    code = conv_sm80.emit(kernel()).code
    assert "int(a.p), int(a.q)" in code
    assert "Mode::kCrossCorrelation" in code
    assert "/*split_k_slices=*/1, kGroups);" in code and "constexpr int kGroups = 1;" in code


@pytest.mark.parametrize("support, cxx, unit", [("strided", "kStrided", "false"),
                                                ("unity", "kUnity", "true")])
def test_stride_support(support, cxx, unit):
    code = conv_sm80.emit(kernel(stride_support=support)).code
    assert f"StrideSupport::{cxx};" in code
    assert f"constexpr bool kUnitStrideOnly = {unit};" in code


@pytest.mark.parametrize("dtype, element", [("f16", "cutlass::half_t"),
                                            ("bf16", "cutlass::bfloat16_t")])
def test_element_types(dtype, element):
    code = conv_sm80.emit(kernel(dtype)).code
    assert f"using ElementA = {element};" in code
    assert "using ElementAccumulator = float;" in code


def test_emit_unit_wraps_conv_kernels():
    ks = [kernel(epilogue=GemmEpilogue(bias=True, activation="relu")),
          kernel("f16", 1, config=conv_sm80.legal_configs("f16", 1, 1, 8)[0],
                 iterator="few_channels")]
    tu = emit_unit([conv_sm80.emit(k) for k in ks], "test")
    assert tu.kernels == tuple(k.name for k in ks)
    assert tu.text.count("#include <cutlass/conv/device/implicit_gemm_convolution.h>") == 1
    assert "struct CoConvArgs" in tu.text
