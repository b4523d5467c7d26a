"""cutlass3x_sm90 conv2d fprop emission (no nvcc): refusals, EVT shape, includes.

The compile itself is checked by hand (see the emitter's commit message); the
numbers are checked on a GPU against PyTorch.
"""
import dataclasses
import string

import pytest

from cutlass_offload.emit import conv_sm90, staged
from cutlass_offload.ir import ConvKernel, ConvProblem, GemmEpilogue, KernelConfig

# these check CUTLASS's TMA epilogue sources (a staged-form test pins that form itself)
pytestmark = pytest.mark.usefixtures("cutlass_tma_epilogue")
TILE, CLUSTER, SCHED = (128, 128, 64), (2, 1, 1), conv_sm90.KERNEL_SCHEDULE   # a searched config


def kernel(dtype="f16", ep=GemmEpilogue(), config=None, **kw):
    config = config or conv_sm90.make_config(TILE, CLUSTER, SCHED)
    fields = dict(arch="sm90a", dtype=dtype, align_a=8, align_b=8, align_c=8, epilogue=ep,
                  config=config, iterator="")
    fields.update(kw)
    return ConvKernel(**fields)


def code(**kw):
    return conv_sm90.emit(kernel(**kw)).code


def problem(**kw):
    fields = dict(c=64, k=64, h=56, w=56, r=3, s=3, dtype="f16", align_a=8, align_b=8,
                  align_c=8, pad=(1, 1, 1, 1))
    fields.update(kw)
    return ConvProblem(**fields)


# --- the KernelSource ---------------------------------------------------------------

def test_kernel_source_shape():
    k = kernel(ep=GemmEpilogue(bias=True))
    src = conv_sm90.emit(k)
    assert src.name == k.name
    assert src.args_type == "CoConvArgs"
    assert src.includes == conv_sm90.INCLUDES
    assert f"namespace {k.name} {{" in src.code
    assert "int64_t workspace_size(const CoConvArgs& args)" in src.code
    assert "int run(const CoConvArgs& args, cudaStream_t stream)" in src.code
    assert "CoGemmArgs" not in src.code


def test_includes_are_the_conv_3x_headers():
    inc = conv_sm90.INCLUDES
    for h in ("cutlass/conv/collective/collective_builder.hpp",
              "cutlass/conv/kernel/conv_universal.hpp",
              "cutlass/conv/device/conv_universal_adapter.hpp",
              "cutlass/conv/convnd_problem_shape.hpp",
              "cutlass/epilogue/collective/collective_builder.hpp",
              "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"):
        assert h in inc
    assert len(set(inc)) == len(inc)
    assert not any("gemm/device" in h for h in inc)


def test_template_placeholders_match_values():
    names = {m.group("named") or m.group("braced")
             for m in string.Template.pattern.finditer(conv_sm90.TEMPLATE.template)
             if m.group("named") or m.group("braced")}
    assert names == set(conv_sm90.values(kernel()))


@pytest.mark.parametrize("store", ["rows", "tma"])
def test_staged_template_placeholders_match_values(monkeypatch, store):
    # the staged epilogue (emit/staged.py) in place of the TMA one: its own placeholders
    monkeypatch.setattr(staged, "ENABLED", True)
    monkeypatch.setattr(staged, "STORE", store)
    names = {m.group("named") or m.group("braced")
             for m in string.Template.pattern.finditer(conv_sm90.STAGED_TEMPLATE.template)
             if m.group("named") or m.group("braced")}
    # the TMA epilogue builder's three are the only values it leaves unused
    assert set(conv_sm90.values(kernel())) - names == {"fusion_type", "epilogue_schedule", "epilogue_tile"}
    assert names <= set(conv_sm90.values(kernel()))
    src = conv_sm90.emit(kernel())
    if store == "rows":
        assert "co_staged::StagedEpilogue<" in src.code
        assert f"{staged.CONV_STRIDE}, {staged.MAX_CHUNK_GROUPS}, {staged.BUFFERS}>>;" in src.code
    else:      # the TMA conv's one consumer warp group
        assert "co_staged::TmaStagedEpilogue<" in src.code
        assert f"{staged.CONV_STRIDE}, {staged.TMA_MAX_CHUNK_COLS}, {staged.TMA_BUFFERS}, 1>>;" in src.code
    assert src.code.count("#ifndef CO_STAGED_EPILOGUE_H") == src.code.count("#ifndef CO_STAGED_TMA_EPILOGUE_H") == 1
    assert "epilogue::collective::CollectiveBuilder" not in src.code
    assert set(staged.INCLUDES) <= set(src.includes)


def test_mainloop_and_problem_shape():
    c = code()
    assert "cutlass::conv::Operator::kFprop" in c
    assert "cutlass::conv::KernelImplicitTmaWarpSpecializedSm90" in c
    assert "cutlass::epilogue::TmaWarpSpecialized," in c
    assert "cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, 2>" in c
    assert "cutlass::layout::TensorNHWC" in c
    # the K mode of the tile is wrapped (conv3x_emitter.py)
    assert "cute::Shape<cute::_128, cute::_128, cute::Shape<cute::_64>>" in c
    assert "cute::Shape<cute::_2, cute::_1, cute::_1>" in c
    assert "cutlass::conv::collective::StageCountAutoCarveout<" in c
    assert "cutlass::Mode" not in c  # the conv mode is cutlass::conv::Mode
    assert "cutlass::conv::Mode::kCrossCorrelation" in c


def test_explicit_stages():
    cfg = conv_sm90.make_config(TILE, CLUSTER, SCHED, stages=4)
    assert "cutlass::conv::collective::StageCount<4>" in code(config=cfg)


def test_asymmetric_padding_from_p_and_q():
    c = code()
    # lower padding from the args, upper padding rebuilt from P, Q (clamped at 0)
    assert "{int(a.pad_h), int(a.pad_w)}" in c
    assert "(out - 1) * stride + dilation * (filter - 1) + 1 - in - lower" in c
    assert "co_upper_pad(a.p, a.h, a.r, a.pad_h, a.stride_h, a.dilation_h)" in c
    assert "co_upper_pad(a.q, a.w, a.s, a.pad_w, a.stride_w, a.dilation_w)" in c
    assert "problem.shape_C[1] != args.p || problem.shape_C[2] != args.q" in c


def test_run_status_paths():
    c = code()
    for status in ("CO_CANNOT_IMPLEMENT", "CO_WORKSPACE_TOO_SMALL", "CO_INIT_FAILED",
                   "CO_LAUNCH_FAILED", "CO_OK"):
        assert status in c
    assert "Conv::can_implement(arguments)" in c
    # initialize + run without the adapter's per-call cudaFuncSetAttribute
    assert "ConvKernel::initialize_workspace(arguments, args.workspace, stream)" in c
    assert "Conv::run(params, stream)" in c
    assert "co_opt_in_smem(cutlass::device_kernel<ConvKernel>" in c
    assert "stride_h > 8" in c
    for forbidden in ("cudaMalloc", "cudaDeviceSynchronize", "cudaStreamSynchronize"):
        assert forbidden not in c


def test_output_stride_is_packed_npqk():
    c = code()
    assert ("cute::make_stride(int64_t(args.k), int64_t(args.q * args.k),\n"
            "                        int64_t(args.p * args.q * args.k))") in c


# --- epilogues ---------------------------------------------------------------------

ROW = "Sm90RowBroadcast<0, TileShape, ElementBias, ElementCompute, cute::Stride<cute::_0, cute::_1, cute::_0>>"


def test_plain_epilogue_is_linear_combination_without_source():
    c = code()
    assert "fusion::LinearCombination<" in c
    assert "using ElementC = void;" in c
    assert "beta = ElementCompute(0)" in c
    assert "Sm90EVT" not in c


def test_bias_only():
    c = code(ep=GemmEpilogue(bias=True))
    assert c.count(ROW) == 1
    assert "Sm90Compute<cutlass::plus, ElementD," in c
    assert "static_cast<ElementBias const*>(args.bias)" in c
    assert "using ElementC = void;" in c
    assert "co_tma_aligned(args.bias)" in c
    assert "Sm90SrcFetch" not in c


@pytest.mark.parametrize("act,functor", [
    ("relu", "cutlass::epilogue::thread::ReLu"), ("gelu_erf", "co_act::GELU"),
    ("gelu_tanh", "cutlass::epilogue::thread::GELU_taylor"), ("silu", "co_act::SiLU"),
    ("sigmoid", "co_act::Sigmoid")])
def test_activation_functor(act, functor):
    c = code(ep=GemmEpilogue(bias=True, activation=act))
    assert f"Sm90Compute<{functor}, ElementD," in c
    # the bias add is rounded to ElementD before the activation, as PyTorch's linear output is
    assert "Sm90Compute<cutlass::plus, ElementD," in c


@pytest.mark.parametrize("op,functor", [("add", "cutlass::plus"), ("mul", "cutlass::multiplies")])
def test_full_residual_is_the_c_operand(op, functor):
    c = code(ep=GemmEpilogue(bias=True, activation="silu", residual=op))
    assert "Sm90SrcFetch<ElementC>" in c
    assert "using ElementC = cutlass::half_t;" in c
    assert "static_cast<ElementC const*>(args.residual)" in c
    assert f"Sm90Compute<{functor}, ElementD," in c
    assert "co_tma_aligned(args.residual)" in c
    assert c.count(ROW) == 1  # bias only


def test_residual_broadcast_is_a_row_broadcast_not_c():
    c = code(dtype="bf16", ep=GemmEpilogue(activation="relu", residual="add",
                                           residual_broadcast=True))
    assert "using ElementC = void;" in c
    assert "Sm90SrcFetch" not in c
    assert c.count(ROW) == 1
    assert "static_cast<ElementBias const*>(args.residual)" in c
    assert "static_cast<ElementC const*>" not in c
    assert "cutlass::bfloat16_t" in c
    assert "co_tma_aligned(args.residual)" in c


def test_evt_order_post_relu_on_top():
    c = code(ep=GemmEpilogue(bias=True, activation="gelu_erf", residual="add",
                             post_activation="relu"))
    order = [c.index(s) for s in (
        "Sm90Compute<cutlass::epilogue::thread::ReLu, ElementD,",      # root
        "Sm90Compute<cutlass::plus, ElementD,",                        # + residual
        "Sm90Compute<co_act::GELU, ElementD,",
        "Sm90AccFetch")]
    order.insert(3, c.rindex("Sm90Compute<cutlass::plus, ElementD,"))   # + bias, under GELU
    assert order == sorted(order) and len(set(order)) == 5
    # every node rounds its result to ElementD, as each PyTorch op does
    assert c.count(", ElementD, ElementCompute, RoundStyle>") == 4
    assert ", ElementCompute, ElementCompute, RoundStyle>" not in c


def test_bias_and_broadcast_residual_are_two_row_broadcasts():
    c = code(ep=GemmEpilogue(bias=True, residual="mul", residual_broadcast=True))
    assert c.count(ROW) == 2
    assert "Sm90Compute<cutlass::multiplies, ElementD," in c


def test_names_differ_by_epilogue():
    a = kernel(ep=GemmEpilogue(residual="add"))
    b = kernel(ep=GemmEpilogue(residual="add", residual_broadcast=True))
    assert a.name != b.name
    assert a.name.startswith("cutlass3x_sm90_conv2d_fprop_f16_nhwc_128x128x64_c2x1x1")


# --- refusals ------------------------------------------------------------------------

def test_refuses_low_alignment():
    for field in ("align_a", "align_b", "align_c"):
        with pytest.raises(ValueError, match="16-byte"):
            conv_sm90.emit(kernel(**{field: 4}))


def test_refuses_tf32_and_wrong_accumulate():
    with pytest.raises(ValueError, match="f16 and bf16"):
        conv_sm90.emit(kernel(dtype="f32"))
    with pytest.raises(ValueError, match="accumulation"):
        conv_sm90.emit(kernel(accumulate="f16"))


def test_refuses_2x_family_and_options():
    sm80 = KernelConfig("cutlass2x_sm80", (128, 128, 32), 3, warp=(64, 64, 32),
                        instruction=(16, 8, 16))
    with pytest.raises(ValueError, match="family"):
        conv_sm90.emit(kernel(arch="sm80", config=sm80, iterator="optimized"))
    with pytest.raises(ValueError, match="stride_support"):
        conv_sm90.emit(kernel(stride_support="unity"))


def test_refuses_gemm_schedules():
    for sched in ("KernelTmaWarpSpecializedCooperative", "KernelTmaWarpSpecializedPingpong",
                  "KernelImplicitTmaWarpSpecializedSm90Cooperative"):
        cfg = conv_sm90.make_config(TILE, CLUSTER, sched)
        with pytest.raises(ValueError, match="kernel_schedule"):
            conv_sm90.emit(kernel(config=cfg))
    cfg = dataclasses.replace(conv_sm90.make_config(TILE, CLUSTER),
                              epilogue_schedule="TmaWarpSpecializedCooperative")
    with pytest.raises(ValueError, match="epilogue_schedule"):
        conv_sm90.emit(kernel(config=cfg))


@pytest.mark.parametrize("tile,cluster,stages,match", [
    ((256, 128, 64), (1, 1, 1), 0, "tile M"),
    ((128, 256, 64), (1, 1, 1), 0, "accumulators"),
    ((128, 72, 64), (1, 1, 1), 0, "tile N"),
    ((128, 128, 48), (1, 1, 1), 0, "tile K"),
    ((128, 128, 64), (1, 1, 2), 0, "cluster"),
    ((128, 128, 64), (4, 2, 1), 0, "cluster"),
    ((128, 128, 64), (1, 1, 1), 1, "stages"),
])
def test_refuses_bad_configs(tile, cluster, stages, match):
    with pytest.raises(ValueError, match=match):
        conv_sm90.emit(kernel(config=conv_sm90.make_config(tile, cluster, stages=stages)))


def test_empty_epilogue_schedule_is_accepted():
    cfg = dataclasses.replace(conv_sm90.make_config(TILE, CLUSTER), epilogue_schedule="")
    assert "cutlass::epilogue::TmaWarpSpecialized," in code(config=cfg)


# --- candidates and supports ---------------------------------------------------------

def test_candidates_are_valid_and_largest_first():
    sizes = [t[0] * t[1] for t, _, _, _ in conv_sm90.CANDIDATES]
    assert sizes == sorted(sizes, reverse=True)
    for tile, cluster, sched, _ in conv_sm90.CANDIDATES:
        conv_sm90.validate(kernel(config=conv_sm90.make_config(tile, cluster, sched)))


def test_make_config():
    cfg = conv_sm90.make_config(TILE, CLUSTER)
    assert cfg.family == "cutlass3x_sm90"
    assert cfg.kernel_schedule == "KernelImplicitTmaWarpSpecializedSm90"
    assert cfg.epilogue_schedule == "TmaWarpSpecialized"
    assert cfg.stages == 0


def test_supports():
    assert conv_sm90.supports(problem())
    assert conv_sm90.supports(problem(dtype="bf16"))
    assert conv_sm90.supports(problem(r=1, s=1, pad=(0, 0, 0, 0), stride=(2, 2)))  # upper < 0
    assert conv_sm90.supports(problem(pad=(0, 2, 1, 0)))                           # asymmetric
    assert conv_sm90.supports(problem(c=8, r=7, s=7, pad=(3, 3, 3, 3), stride=(2, 2)))
    assert not conv_sm90.supports(problem(dtype="f32", tf32=True, align_a=4, align_b=4,
                                          align_c=4))
    assert not conv_sm90.supports(problem(c=3, align_a=1, align_b=1))   # RGB stem
    assert not conv_sm90.supports(problem(k=20, align_c=4))
    assert not conv_sm90.supports(problem(stride=(9, 1), h=200))         # TMA stride <= 8
    assert not conv_sm90.supports(problem(pad=(129, 129, 0, 0), h=8))    # corner < -128
    # filter offset (R-1)*dil = 255 with both corners in range
    assert conv_sm90.supports(problem(h=600, r=2, dilation=(254, 1), pad=(0, 127, 1, 1)))
    assert not conv_sm90.supports(problem(h=600, r=2, dilation=(255, 1), pad=(0, 127, 1, 1)))


def test_a_tile_several_wgmmas_span_keeps_the_tma_epilogue(monkeypatch):
    # the conv builder's 160-wide tile is five 32-wide wgmmas (MMA_N = 5): the staged
    # epilogues read one wgmma across the tile, so it keeps CUTLASS's TMA epilogue
    monkeypatch.setattr(staged, "ENABLED", True)
    wide = ConvKernel(arch="sm90a", dtype="f16", align_a=8, align_b=8, align_c=8,
                      epilogue=GemmEpilogue(bias=True), config=conv_sm90.make_config((128, 160, 64), (1, 1, 1)),
                      iterator="")
    assert not conv_sm90.staged_epilogue_applies(wide)
    assert "epilogue::collective::CollectiveBuilder" in conv_sm90.emit(wide).code
    assert conv_sm90.staged_epilogue_applies(dataclasses.replace(wide, config=conv_sm90.make_config(
        (128, 128, 64), (1, 1, 1))))
