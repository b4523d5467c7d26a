"""N-split cooperative sm90a GEMMs (no nvcc, no GPU): the two consumer warp groups
side by side along N (KernelConfig.warp = (M, N / 2, K)), so that 192-row tiles fill
the waves of tall problems (whisper's 6000 x 768: 128 CTAs of 192x192 on 132 SMs).
The config, what the emitter writes for it, where the search proposes it and where a
learned table entry of that kind is passed over."""
from dataclasses import replace

import pytest

from cutlass_offload.emit import conv_sm90, gemm_sm90, sm90_parts
from cutlass_offload.ir import ConvKernel, GemmEpilogue, GemmKernel, GemmLaunch, GemmProblem, KernelConfig
from cutlass_offload.select import DEFAULT_NUM_SMS, sm90

SMS = DEFAULT_NUM_SMS["sm90a"]
NS_192 = sm90._config((192, 192, 64), (1, 1, 1), sm90.COOP, n_split=True)


def _problem(m, n, k, dtype="f16", epilogue=None):
    return GemmProblem(n=n, k=k, dtype=dtype, layout_b="col", align_a=8, align_b=8, align_c=8,
                       epilogue=epilogue or GemmEpilogue(bias=True), m=m, m_hint=m)


def _kernel(config, dtype="f16", epilogue=None, layout_b="col"):
    return GemmKernel(arch="sm90a", dtype=dtype, layout_b=layout_b, align_a=8, align_b=8, align_c=8,
                      epilogue=epilogue or GemmEpilogue(bias=True), config=config)


def test_the_config_names_the_warp_group_tile():
    assert NS_192.n_split and NS_192.warp == (192, 96, 64)
    assert NS_192.tag == "192x192x64_c1x1x1_coopn"
    mid = sm90.CONFIGS["mid"]
    assert not mid.n_split and mid.tag == "128x128x64_c1x1x1_coop"
    with pytest.raises(ValueError, match="warp group tile"):
        KernelConfig("cutlass3x_sm90", (192, 192, 64), 0, warp=(96, 192, 64),
                     kernel_schedule=sm90.COOP)
    # 2.x configs keep their warp tiles
    assert not KernelConfig("cutlass2x_sm80", (128, 128, 32), 3, warp=(64, 64, 32)).n_split


@pytest.mark.parametrize("dtype, layout_b, atom", [
    ("f16", "col", "MMA_64x96x16_F32F16F16_SS<MajorA, MajorB>"),
    ("bf16", "row", "MMA_64x96x16_F32BF16BF16_SS<MajorA, MajorB>"),
])
def test_the_mainloop_and_epilogue_are_assembled_for_the_n_split(dtype, layout_b, atom):
    src = gemm_sm90.emit(_kernel(NS_192, dtype, layout_b=layout_b))
    code = src.code
    assert src.name.endswith("192x192x64_c1x1x1_coopn_align888_bias")
    assert atom in code
    assert "cute::Layout<cute::Shape<cute::_1, cute::_2, cute::_1>>{}" in code
    # the builders are not used (they split rows only, 128-row subtiles only) ...
    assert "CollectiveBuilder" not in code
    # ... but their parts are, with one subtile as wide as the tile and one store stage
    assert "using EpilogueTile = cute::Shape<cute::_64, cute::_192>;" in code
    assert "WarpGroupTile = cute::Shape<cute::_64, cute::_96>;" in code
    assert "EpiloguePolicyAuto::StagesC, 1," in code
    assert "MainloopSm90TmaGmmaWarpSpecialized<MainloopStages, ClusterShape," in code
    assert "cutlass::gemm::KernelTmaWarpSpecializedCooperative>" in code
    assert "gmma_ss_tag_to_major_B<ElementB, LayoutB>()" in code
    # the bias EVT and the launch path are the family's own
    assert "Sm90RowBroadcast<0, TileShape, ElementBias" in code
    assert "co_params_cache.find(args)" in code
    assert src.includes == (gemm_sm90.INCLUDES + (gemm_sm90.KERNEL_HEADER[sm90.COOP],)
                            + gemm_sm90.TMA_EPILOGUE_INCLUDES)
    assert src.defines == gemm_sm90.GDC_DEFINES


def test_a_warp_group_n_outside_the_default_wgmma_shapes_gets_the_extended_headers():
    cfg = sm90._config((192, 160, 64), (2, 1, 1), sm90.COOP, n_split=True)
    src = gemm_sm90.emit(_kernel(cfg))
    assert sm90_parts.wgmma_n(cfg) == 80 and sm90_parts.wide_mma(cfg)
    assert src.includes == (gemm_sm90.INCLUDES + (gemm_sm90.KERNEL_HEADER[sm90.COOP],)
                            + sm90_parts.WGMMA_EXT_INCLUDES + gemm_sm90.TMA_EPILOGUE_INCLUDES)
    assert "MMA_64x80x16_F32F16F16_SS<MajorA, MajorB>" in src.code
    assert "ss_op_selector" not in src.code      # the atom is named, no selector needed
    assert "cute::Shape<cute::_2, cute::_1, cute::_1>;" in src.code    # the cluster


@pytest.mark.usefixtures("cutlass_tma_epilogue")
def test_other_kernels_source_is_unchanged_by_the_n_split_template():
    for cfg in (sm90.CONFIGS["mid"], sm90.CONFIGS["stream_k"],
                sm90._config((128, 176, 64), (1, 1, 1), sm90.COOP)):
        code = gemm_sm90.emit(_kernel(cfg)).code
        assert gemm_sm90.template_for(_kernel(cfg)) is gemm_sm90.TEMPLATE
        assert "CollectiveBuilder<" in code and "EpiloguePolicy" not in code
    glu = _kernel(sm90.CONFIGS["mid"], epilogue=GemmEpilogue(activation="silu", glu=True))
    assert gemm_sm90.template_for(glu) is gemm_sm90.GLU_TEMPLATE


@pytest.mark.parametrize("change, match", [
    (dict(config=replace(NS_192, kernel_schedule=sm90.PINGPONG, epilogue_schedule="")), "cooperative"),
    (dict(config=replace(NS_192, tile_scheduler="stream_k")), "persistent"),
    (dict(epilogue=GemmEpilogue(activation="silu", glu=True)), "GLU"),
    (dict(config=sm90._config((192, 224, 64), (1, 1, 1), sm90.COOP, n_split=True)), "accumulators"),
    (dict(config=sm90._config((192, 176, 64), (1, 1, 1), sm90.COOP, n_split=True)), "multiple of 32"),
])
def test_n_split_limits_are_refused(change, match):
    k = replace(_kernel(NS_192), **change)
    with pytest.raises(ValueError, match=match):
        gemm_sm90.emit(k)


def test_tf32_is_refused():
    k = replace(_kernel(NS_192), dtype="f32", align_a=4, align_b=4, align_c=4)
    with pytest.raises(ValueError, match="f16 / bf16"):
        gemm_sm90.emit(k)


def test_the_conv_family_refuses_an_n_split_config():
    config = replace(conv_sm90.make_config((128, 128, 64), (1, 1, 1), conv_sm90.KERNEL_SCHEDULE),
                     warp=(128, 64, 64))
    k = ConvKernel(arch="sm90a", dtype="f16", align_a=8, align_b=8, align_c=8,
                   epilogue=GemmEpilogue(bias=True), config=config, iterator="")
    with pytest.raises(ValueError, match="N-split"):
        conv_sm90.emit(k)


def test_the_search_proposes_192_row_tiles_where_they_fill_the_waves():
    # whisper's projections: 32 x 4 = 128 CTAs of 192x192 (one wave); 128x192 makes 188
    fitted = sm90.fitted_configs(_problem(6000, 768, 768), SMS)
    ns = [c for c in fitted if c.n_split]
    assert {(c.tile, c.cluster) for c in ns} >= {((192, 192, 64), (1, 1, 1)), ((192, 192, 64), (2, 1, 1))}
    assert all(c.kernel_schedule == sm90.COOP and c.warp == (192, c.tile[1] // 2, 64) for c in ns)
    for c in ns:                   # each one beats every fixed tile's estimate
        est = sm90.tile_estimate(6000, 768, 192, c.tile[1], SMS)
        assert all(est * sm90.FIT_MIN_GAIN <= sm90.tile_estimate(6000, 768, tm, tn, SMS)
                   for tm in sm90._FIXED_N for tn in sm90._FIXED_N[tm])
        gemm_sm90.emit(_kernel(c))
    # a full wave of 128x256 tiles leaves nothing to gain; one row of tiles is too short
    assert not any(c.n_split for c in sm90.fitted_configs(_problem(4096, 4096, 4096), SMS))
    assert not any(c.n_split for c in sm90.fitted_configs(_problem(300, 768, 768), SMS))


def test_no_n_split_proposal_or_table_entry_for_a_glu_problem():
    glu = _problem(6000, 768, 768, epilogue=GemmEpilogue(activation="silu", glu=True))
    assert not any(c.n_split for c in sm90.fitted_configs(glu, SMS))
    entry = {"m": 6000, "n": 768, "k": 768, "batch": 1, "layout_b": "col",
             "config": {"family": "cutlass3x_sm90", "tile": [192, 192, 64], "stages": 0,
                        "warp": [192, 96, 64], "cluster": [1, 1, 1],
                        "kernel_schedule": sm90.COOP, "tile_scheduler": "persistent"},
             "launch": {"raster": "along_m", "swizzle": 2}}
    table = sm90.Table({"gpu": "H200", "num_sms": SMS, "entries": [entry]})
    plain = _problem(6000, 768, 768)
    assert sm90.choose(plain, SMS, table) == (NS_192, GemmLaunch(raster="along_m", swizzle=2))
    assert sm90.choose(glu, SMS, table)[0] == sm90.CONFIGS[sm90.choose_name(glu, SMS)]
    assert not sm90.choose(glu, SMS, table)[0].n_split
