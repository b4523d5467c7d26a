"""Convs lowered onto the sm90 GEMM (families/conv_gemm_sm90.py, emit/conv_gemm_sm90.py):
which problems take which lowering, the GEMM they run, and the C++ emitted (no GPU,
no compiler; the build tier compiles it, tests/gpu runs it)."""
import dataclasses

import pytest

from cutlass_offload.build.shards import unit_class
from cutlass_offload.emit import conv_gemm_sm90 as emitter
from cutlass_offload.emit import emit_kernel
from cutlass_offload.families import conv_gemm_sm90 as rules
from cutlass_offload.ir import ConvKernel, ConvProblem, GemmEpilogue
from cutlass_offload.select import sm90
from cutlass_offload.select.conv import choose_conv_kernel, pad_channels

EP = GemmEpilogue(bias=True, activation="relu")


def _problem(**kw):
    fields = dict(c=3, k=64, h=224, w=224, r=7, s=7, dtype="f16", align_a=1, align_b=1, align_c=8,
                  pad=(3, 3, 3, 3), stride=(2, 2), epilogue=EP, n_hint=8)
    return ConvProblem(**{**fields, **kw})


ONE_BY_ONE = dict(c=32, k=16, h=112, w=112, r=1, s=1, pad=(0, 0, 0, 0), stride=(1, 1),
                  align_a=8, align_b=8, n_hint=32)


@pytest.mark.parametrize("kw, expected", [
    ({}, "im2col"),                                                   # ResNet-50 stem, C = 3
    (dict(c=4, k=320, h=64, w=64, r=3, s=3, pad=(1, 1, 1, 1), stride=(1, 1), align_a=4,
          align_b=4), "im2col"),                                      # SD conv_in, C = 4
    (dict(c=3, k=96, r=4, s=4, pad=(0, 0, 0, 0), stride=(4, 4)), "im2col"),   # patchify
    (ONE_BY_ONE, "direct"),
    ({**ONE_BY_ONE, "dilation": (2, 2)}, "direct"),                  # dilation moot at 1x1
    ({**ONE_BY_ONE, "stride": (2, 2)}, ""),                          # strided 1x1: TMA conv
    ({**ONE_BY_ONE, "pad": (1, 1, 1, 1)}, ""),
    ({**ONE_BY_ONE, "c": 36, "align_a": 4, "align_b": 4}, ""),       # C % 8: x is no TMA A
    ({**ONE_BY_ONE, "k": 20, "align_c": 4}, ""),                     # K % 8: y rows unaligned
    (dict(c=9, align_a=1, align_b=1), ""),                           # padded to 16 instead
    (dict(k=60, align_c=4), ""),
    (dict(c=4, h=1, w=1, r=1, s=1, pad=(0, 0, 0, 0), stride=(1, 1), align_a=4, align_b=4), ""),
    (dict(dtype="f32", tf32=True), ""),
    (dict(epilogue=GemmEpilogue(bias=True, residual="mul", residual_broadcast=True)), ""),
])
def test_which_lowering(kw, expected):
    assert rules.iterator_for(_problem(**kw)) == expected


def test_gemm_problem_shapes():
    stem = _problem()
    g = rules.gemm_problem(stem, "im2col")
    assert (g.m_hint, g.n, g.k, g.layout_b) == (8 * 112 * 112, 64, 152, "col")   # 7*7*3 = 147 -> 152
    assert g.epilogue == EP and (g.align_a, g.align_b, g.align_c) == (8, 8, 8)
    d = rules.gemm_problem(_problem(**ONE_BY_ONE), "direct")
    assert (d.m_hint, d.n, d.k) == (32 * 112 * 112, 16, 32) and d.m is None
    fixed = rules.gemm_problem(_problem(**ONE_BY_ONE, n=4), "direct")
    assert fixed.m == 4 * 112 * 112
    big = _problem(n_hint=1024)                      # an im2col GEMM covers one chunk of rows
    rows = rules.chunk_rows(152, "f16")
    assert rules.gemm_problem(big, "im2col").m_hint == rows < 1024 * 112 * 112
    assert rows % rules.CHUNK_ROW_MULTIPLE == 0 and rows * 152 * 2 <= rules.IM2COL_CHUNK_BYTES
    assert rules.chunk_rows(1 << 22, "f16") == rules.CHUNK_ROW_MULTIPLE        # at least one tile
    with pytest.raises(ValueError, match="iterator"):
        rules.gemm_problem(stem, "")


def test_selection_takes_the_lowering_on_sm90a_only():
    stem = pad_channels(_problem(), "sm90a")
    assert stem.pad_c == 0
    k = choose_conv_kernel(stem, "sm90a", 132)
    assert k.iterator == "im2col" and k.config.family == "cutlass3x_sm90"
    config, launch = sm90.choose(rules.gemm_problem(stem, "im2col"), 132)
    assert k.config == config and k.launch == dataclasses.replace(launch, pdl=False)
    assert (k.align_a, k.align_b, k.align_c) == (1, 1, 8)
    assert "_im2col_" in k.name
    d = choose_conv_kernel(_problem(**ONE_BY_ONE), "sm90a", 132)
    # EfficientNet's 32 -> 16 1x1 conv: the GEMM family's choice for its GEMM (the learned
    # table's skinny 256x16x32 tile since session 28; the narrow rule's 128x64 without it)
    g = rules.gemm_problem(_problem(**ONE_BY_ONE), "direct")
    assert d.iterator == "direct" and d.config == sm90.choose(g, 132)[0] and d.config.tile[1] <= 64
    assert sm90.choose(g, 132, table=None)[0].tile[1] == 64
    sm80 = choose_conv_kernel(_problem(), "sm80", 108)
    assert sm80.config.family == "cutlass2x_sm80"
    tma = choose_conv_kernel(_problem(**{**ONE_BY_ONE, "stride": (2, 2)}), "sm90a", 132)
    assert tma.iterator == "" and tma.config.kernel_schedule == "KernelImplicitTmaWarpSpecializedSm90"


def test_shape_rules_give_narrow_n_a_narrow_tile():
    # a lowered conv's GEMM: huge M, N <= 64 (a 128x256 tile would be 3/4 empty)
    g = rules.gemm_problem(_problem(**ONE_BY_ONE), "direct")
    assert sm90.choose_name(g, 132) == "narrow"
    wide = rules.gemm_problem(_problem(**{**ONE_BY_ONE, "k": 512}), "direct")
    assert sm90.choose_name(wide, 132) == "big"


def _kernel(iterator, **kw):
    p = _problem(**(ONE_BY_ONE if iterator == "direct" else {}))
    k = choose_conv_kernel(p, "sm90a", 132)
    assert k.iterator == iterator
    return dataclasses.replace(k, **kw)


@pytest.mark.parametrize("iterator", ["direct", "im2col"])
def test_emitted_source(iterator):
    k = _kernel(iterator)
    src = emit_kernel(k)
    assert src.name == k.name and src.args_type == "CoConvArgs"
    code = src.code
    assert f"namespace {k.name} {{" in code and "namespace gemm {" in code
    assert "__attribute__((weak)) int run(const CoGemmArgs& args" in code
    assert "int run(const CoConvArgs& args, cudaStream_t stream)" in code
    assert "int64_t workspace_size(const CoConvArgs& args)" in code
    assert f"constexpr bool kIm2col = {'true' if iterator == 'im2col' else 'false'};" in code
    assert "co_im2col::pack<Element><<<" in code and "namespace co_im2col {" in code
    assert "cutlass::layout::ColumnMajor" in code          # B = the filter, K-major
    assert "|| !aligned16(args.bias)" in code               # the bias is read
    assert src.defines == ("CUTLASS_ENABLE_GDC_FOR_SM90",) and "kPdl = 1" in code
    assert set(src.includes) == set(emitter.gemm_sm90.includes(emitter.gemm_kernel(k)))
    assert set(emitter.gemm_sm90.INCLUDES) <= set(src.includes)
    assert "${" not in code


@pytest.mark.parametrize("cluster", [(1, 1, 1), (2, 1, 1)])
def test_a_clustered_gemm_brings_its_occupancy_query(cluster):
    """A lowered conv on a clustered GEMM config carries the GEMM's cluster occupancy
    query and the preamble that defines it (session 51: the unit failed to compile,
    "co_max_active_clusters is undefined", when only the GEMM family added it)."""
    k = _kernel("direct", config=dataclasses.replace(sm90.CONFIGS["big"], cluster=cluster))
    src = emit_kernel(k)
    queries = "co_max_active_clusters(" in src.code
    assert queries == (cluster != (1, 1, 1))
    assert (emitter.gemm_sm90.CLUSTER_OCCUPANCY in src.preamble) == queries
    assert src.preamble == emitter.gemm_sm90.preamble(emitter.gemm_kernel(k))


def test_stream_k_config_is_a_stream_k_unit():
    k = _kernel("im2col", config=sm90.CONFIGS["stream_k"])
    src = emit_kernel(k)
    assert src.defines == () and "cutlass::gemm::StreamKScheduler" in src.code
    assert unit_class(k) == "gemm3x_stream_k"
    assert unit_class(_kernel("direct")) == "common"            # with the GEMMs, not conv3x
    from cutlass_offload.ir import GemmLaunch
    tma = dataclasses.replace(_kernel("direct"), iterator="", launch=GemmLaunch())
    assert unit_class(tma) == "conv3x"


def test_refusals():
    with pytest.raises(ValueError, match="alignments must be 8"):
        emit_kernel(_kernel("direct", align_a=4))
    with pytest.raises(ValueError, match="align_c"):
        emit_kernel(_kernel("im2col", align_c=4))
    with pytest.raises(ValueError, match="per-channel residual"):
        emit_kernel(_kernel("im2col", epilogue=GemmEpilogue(residual="add", residual_broadcast=True)))
    with pytest.raises(ValueError, match="cooperative schedule needs tile M"):
        bad = dataclasses.replace(sm90.CONFIGS["mid"], tile=(64, 128, 64))
        emit_kernel(_kernel("direct", config=bad))
    with pytest.raises(ValueError, match="iterator"):
        ConvKernel(arch="sm90a", dtype="f16", align_a=8, align_b=8, align_c=8, epilogue=EP,
                   config=sm90.CONFIGS["mid"], iterator="optimized")


def test_launch_knobs_are_compiled_in_and_named():
    from cutlass_offload.ir import GemmLaunch
    k = _kernel("im2col", config=sm90.CONFIGS["stream_k"],
                launch=GemmLaunch(raster="along_n", swizzle=4, decomposition="split_k", splits=3))
    code = emit_kernel(k).code
    assert "g.raster_order = 2;" in code and "g.swizzle = 4;" in code
    assert "g.splits = 3;" in code and "g.decomposition = 2;" in code
    assert k.name.endswith("_im2col_along_n_swz4_splitk3_align118_bias_relu")
    plain = _kernel("im2col", launch=GemmLaunch())
    assert "g.raster_order = 0;" in emit_kernel(plain).code and "_im2col_align" in plain.name
    with pytest.raises(ValueError, match="pdl"):
        _kernel("direct", launch=GemmLaunch(pdl=True))
    with pytest.raises(ValueError, match="stream-K"):
        _kernel("direct", config=sm90.CONFIGS["mid"], launch=GemmLaunch(decomposition="split_k", splits=2))
    with pytest.raises(ValueError, match="lowered"):
        dataclasses.replace(_kernel("direct"), iterator="", launch=GemmLaunch(swizzle=2))
    chosen = _kernel("im2col")
    assert chosen.launch == GemmLaunch() or f"_im2col_{chosen.launch.tag}_align" in chosen.name


def test_few_output_channels_get_narrow_2x_tiles():
    """K % 8 != 0 keeps a 2.x kernel on sm90a; with K <= 32 its tile is 16 or 32 wide."""
    vae_out = _problem(c=128, k=3, h=512, w=512, r=3, s=3, pad=(1, 1, 1, 1), stride=(1, 1),
                       align_a=8, align_b=8, align_c=1, n_hint=1)
    k = choose_conv_kernel(vae_out, "sm90a", 132)
    assert k.config.family == "cutlass2x_sm80" and k.config.tile == (128, 16, 32)
    assert k.config.warp == (64, 16, 32)            # two warps: 64 filter accesses, one each
    from cutlass_offload.emit import emit_kernel
    emit_kernel(k)                                  # passes the family's checks
    with pytest.raises(ValueError, match="fewer 16-byte accesses"):
        emit_kernel(dataclasses.replace(k, config=dataclasses.replace(k.config, warp=(32, 16, 32))))
    k20 = choose_conv_kernel(dataclasses.replace(vae_out, k=20, align_c=4), "sm90a", 132)
    assert k20.config.tile == (128, 32, 32)
    small = choose_conv_kernel(dataclasses.replace(vae_out, h=8, w=8), "sm90a", 132)
    assert small.config.tile == (64, 16, 32)           # too few 128-row tiles for half a wave
    wide = choose_conv_kernel(dataclasses.replace(vae_out, k=60, align_c=4), "sm90a", 132)
    assert wide.config.tile[1] >= 64


@pytest.mark.parametrize("iterator", ["direct", "im2col"])
def test_a_lowered_conv_carries_the_staged_epilogues_header(iterator, monkeypatch):
    # the lowered conv's GEMM takes the staged epilogue like any GEMM
    # (emit/staged.ENABLED), so its source must carry the template
    from cutlass_offload.emit import staged
    monkeypatch.setattr(staged, "ENABLED", True)
    monkeypatch.setattr(staged, "STORE", "tma")
    code = emit_kernel(_kernel(iterator)).code
    assert "co_staged::TmaStagedEpilogue<" in code
    assert code.count("#ifndef CO_STAGED_TMA_EPILOGUE_H") == code.count("#ifndef CO_STAGED_COMMON_H") == 1
    assert code.index("#ifndef CO_STAGED_TMA_EPILOGUE_H") < code.index("co_staged::TmaStagedEpilogue<")
