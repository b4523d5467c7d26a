"""sm90a GEMM kernel choice (no nvcc, no GPU): the shape heuristic, the candidate
set for --tune, and the stream-K tile scheduler in the config and the emitter."""
from dataclasses import replace
from types import SimpleNamespace

import pytest

from cutlass_offload.emit import gemm_sm90, sm90_parts
from cutlass_offload.ir import (
    GemmEpilogue,
    GemmKernel,
    GemmLaunch,
    GemmProblem,
    KernelConfig,
)
from cutlass_offload.runtime.library import CoGemmArgs
from cutlass_offload.select import (
    DEFAULT_NUM_SMS,
    candidate_kernels,
    choose_kernel,
    sm90,
    tuning_id,
)

SMS = DEFAULT_NUM_SMS["sm90a"]


def _problem(m, n, k, *, dynamic=False, dtype="f16", epilogue=None, align=8):
    epilogue = epilogue or GemmEpilogue(bias=True)
    return GemmProblem(n=n, k=k, dtype=dtype, layout_b="col", align_a=align, align_b=align,
                       align_c=align, epilogue=epilogue, m=None if dynamic else m, m_hint=m)


def _tile(m, n, k, **kw):
    """The shape rules' config (the learned table left out)."""
    return choose_kernel(_problem(m, n, k, **kw), "sm90a", table=False).config


def test_small_m_never_gets_the_big_tile():
    # design.md: 128x256 ran 77x1280x768 at 17.5 us against PyTorch's 10.6 us
    cfg = _tile(77, 1280, 768)
    assert cfg.tile[:2] != (128, 256)
    assert cfg.tile[0] == 64 and cfg.kernel_schedule == sm90.PINGPONG


def test_large_square_gets_the_big_tile():
    for shape in ((4096, 4096, 4096), (8192, 5120, 1280)):
        cfg = _tile(*shape)
        assert (cfg.tile, cfg.cluster, cfg.kernel_schedule) == ((128, 256, 64), (2, 1, 1), sm90.COOP)
        assert cfg.tile_scheduler == "persistent"


@pytest.mark.parametrize("shape, name", [
    ((1024, 3072, 768), "small"),      # bert-base FFN up: ping-pong 16.3 vs 128x128 18.1 us
    ((1024, 768, 768), "small"),       # bert-base attention projections: 48 tiles of 128x128
    ((16, 4096, 4096), "small"),       # decode-like: stream-K is a --tune candidate only
    ((128, 1280, 5120), "small"),      # UNet: ping-pong 16.6 vs stream-K 31.5 us
    ((512, 10240, 1280), "small"),     # UNet: 1.2 waves of 128x256 tiles lost (32.2 vs 24.3 us)
    ((2048, 5120, 640), "big"),        # 2.4 waves of 128x256 tiles
    ((2048, 640, 640), "mid"),         # M > 1024: 80 tiles of 128x128
    ((2048, 64, 1024), "narrow"),      # N = 64: a 128-wide tile would be half empty
    ((128, 32768, 1024), "wide"),      # small M, wide N: two waves of 64x256 tiles
    ((2, 1280, 320), "small"),         # the UNet's time embedding: small M and K
])
def test_heuristic_picks_by_shape(shape, name):
    assert sm90.choose_name(_problem(*shape), SMS) == name
    assert _tile(*shape) == sm90.CONFIGS[name]


def test_choice_is_pure_and_uses_the_hint_for_dynamic_m():
    a = _tile(1024, 3072, 768)
    assert a == _tile(1024, 3072, 768)
    assert a == _tile(1024, 3072, 768, dynamic=True)
    # fewer SMs: 96 tiles of 128x256 are 1.5 waves of 64 SMs
    assert choose_kernel(_problem(1024, 3072, 768), "sm90a", num_sms=64,
                         table=False).config == sm90.CONFIGS["big"]


def test_candidates_at_most_four_heuristic_first_all_emit():
    for shape in ((77, 1280, 768), (4096, 4096, 4096), (1024, 768, 3072), (8, 768, 768),
                  (16, 4096, 4096), (2048, 64, 1024), (1024, 3072, 768)):
        p = _problem(*shape)
        cands = candidate_kernels(p, "sm90a")
        assert 1 <= len(cands) <= 4
        assert cands[0] == choose_kernel(p, "sm90a")
        assert len({k.name for k in cands}) == len(cands)
        for k in cands:
            gemm_sm90.emit(k)            # every candidate is a legal kernel


def test_candidates_fall_back_to_2x_configs_for_misaligned_problems():
    p = _problem(1024, 770, 768, align=2)
    cands = candidate_kernels(p, "sm90a")
    assert cands[0] == choose_kernel(p, "sm90a")
    assert {k.config.family for k in cands} == {"cutlass2x_sm80"} and len(cands) <= 4


def _kernel(config):
    return GemmKernel(arch="sm90a", dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                      epilogue=GemmEpilogue(bias=True, activation="relu"), config=config)


def test_stream_k_config_emits_the_stream_k_scheduler():
    k = _kernel(sm90.CONFIGS["stream_k"])
    src = gemm_sm90.emit(k).code
    assert "cutlass::gemm::StreamKScheduler>" in src
    assert k.name.endswith("_bias_relu") and "_streamk_" in k.name
    # persistent kernels keep their source (and build cache entries) unchanged
    persistent = gemm_sm90.emit(_kernel(sm90.CONFIGS["mid"])).code
    assert "Scheduler" not in persistent and "    CollectiveEpilogue>;" in persistent


def test_stream_k_needs_the_cooperative_schedule_and_3x():
    bad = KernelConfig("cutlass3x_sm90", (64, 128, 64), 0, kernel_schedule=sm90.PINGPONG,
                       tile_scheduler="stream_k")
    with pytest.raises(ValueError, match="cooperative"):
        gemm_sm90.emit(_kernel(bad))
    with pytest.raises(ValueError, match="3.x"):
        KernelConfig("cutlass2x_sm80", (128, 128, 32), 3, warp=(64, 64, 32), tile_scheduler="stream_k")
    with pytest.raises(ValueError, match="tile_scheduler"):
        KernelConfig("cutlass3x_sm90", (128, 128, 64), 0, tile_scheduler="split_k")


def test_tuning_id_same_problem_same_id():
    a = tuning_id(_problem(1024, 768, 768))
    assert a == tuning_id(_problem(1024, 768, 768))
    assert a == tuning_id(_problem(1024, 768, 768, dynamic=True))     # tuned at the hint size
    assert a != tuning_id(_problem(1024, 768, 768, epilogue=GemmEpilogue(bias=True, activation="relu")))
    assert a != tuning_id(_problem(1024, 768, 768, dtype="bf16"))
    assert a != tuning_id(_problem(1024, 768, 768, align=4))
    assert a != tuning_id(_problem(512, 768, 768))


# -- launch knobs ----------------------------------------------------------------------

def test_launch_knobs_validate_and_stay_out_of_the_kernel_name():
    with pytest.raises(ValueError, match="raster"):
        GemmLaunch(raster="diagonal")
    with pytest.raises(ValueError, match="swizzle"):
        GemmLaunch(swizzle=3)
    with pytest.raises(ValueError, match="split_k"):
        GemmLaunch(splits=2)
    assert GemmLaunch().tag == "default"
    assert GemmLaunch(raster="along_n", swizzle=4, pdl=True).tag == "along_n_swz4_pdl"
    assert GemmLaunch(decomposition="split_k", splits=3).tag == "splitk3"
    k = _kernel(sm90.CONFIGS["mid"])
    knobbed = replace(k, launch=GemmLaunch(raster="along_m", swizzle=2, pdl=True))
    assert knobbed.name == k.name and knobbed != k          # one compiled kernel, two launches
    with pytest.raises(ValueError, match="stream-K"):
        replace(k, launch=GemmLaunch(decomposition="data_parallel"))
    replace(_kernel(sm90.CONFIGS["stream_k"]), launch=GemmLaunch(decomposition="split_k", splits=4))
    sm80 = KernelConfig("cutlass2x_sm80", (128, 128, 32), 3, warp=(64, 64, 32))
    with pytest.raises(ValueError, match="3.x"):
        replace(k, arch="sm80", config=sm80, launch=GemmLaunch(pdl=True))


def test_args_carry_the_launch_knobs():
    a = CoGemmArgs()
    a.set_launch(GemmLaunch(raster="along_n", swizzle=8, decomposition="split_k", splits=3, pdl=True))
    assert (a.raster_order, a.swizzle, a.splits, a.decomposition, a.pdl) == (2, 8, 3, 2, 1)
    a.set_launch(GemmLaunch())
    assert (a.raster_order, a.swizzle, a.splits, a.decomposition, a.pdl) == (0, 1, 1, 0, 0)


def test_emitted_kernels_read_the_knobs_and_refuse_what_they_cannot_take():
    persistent = gemm_sm90.emit(_kernel(sm90.CONFIGS["mid"])).code
    stream_k = gemm_sm90.emit(_kernel(sm90.CONFIGS["stream_k"])).code
    for src in (persistent, stream_k):
        assert "arguments.scheduler.raster_order" in src and "max_swizzle_size = args.swizzle" in src
        assert "Gemm::run(params, stream, nullptr, args.pdl != 0)" in src
        assert "!co_knobs_ok(args)" in src
    assert "args.splits <= 1 && args.decomposition == 0" in persistent
    assert "arguments.scheduler.splits" not in persistent
    assert "arguments.scheduler.splits = args.splits" in stream_k
    assert "decomposition_mode" in stream_k


# -- the search space and the learned table ----------------------------------------------

SHAPES = ((77, 1280, 768), (4096, 4096, 4096), (1024, 768, 3072), (8, 768, 768), (6000, 768, 768),
          (2048, 5632, 2048), (2048, 256, 2048), (16, 4096, 4096), (2048, 64, 1024))


def test_space_configs_are_distinct_and_legal():
    assert len(sm90.SPACE) == len(set(sm90.SPACE)) >= 25
    assert set(sm90.CONFIGS.values()) <= set(sm90.SPACE)
    for c in sm90.SPACE:
        gemm_sm90.emit(_kernel(c))
    tiles = {c.tile for c in sm90.SPACE}
    assert {(128, 96, 64), (128, 192, 64), (256, 128, 64), (64, 192, 64)} <= tiles
    assert {c.cluster for c in sm90.SPACE} >= {(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1)}
    pingpong_128 = [c for c in sm90.SPACE if c.kernel_schedule == sm90.PINGPONG and c.tile[0] == 128]
    assert pingpong_128 and all(c.tile[1] <= 128 for c in pingpong_128)


@pytest.mark.parametrize("shape", SHAPES)
def test_search_space_heuristic_first_then_plausible_configs(shape):
    p = _problem(*shape)
    space = sm90.search_space(p, SMS)
    assert space[0] == choose_kernel(p, "sm90a").config
    assert len(set(space)) == len(space) >= 3
    fitted = set(sm90.fitted_configs(p, SMS))
    assert all(sm90.plausible(p, c, SMS) for c in space[1:] if c not in fitted)
    assert fitted <= set(space)
    m = shape[0]
    assert all(c.tile[0] <= 128 for c in space[1:]) if m <= 128 else True


def test_tile_estimate_counts_whole_waves():
    # 2048 x 5632 on 132 SMs: 128x128 tiles make 704 CTAs (6 waves, the last a third
    # full), 128x176 make 512 (4 waves): fewer waves of a slightly larger tile
    t128 = sm90.tile_estimate(2048, 5632, 128, 128, 132)
    t176 = sm90.tile_estimate(2048, 5632, 128, 176, 132)
    assert t176 < t128
    # one CTA more than a wave costs a whole wave more
    assert sm90.tile_estimate(128 * 133, 128, 128, 128, 132) == 2 * sm90.tile_estimate(
        128 * 132, 128, 128, 128, 132)


@pytest.mark.parametrize("shape, tile", [
    ((512, 1280, 1280), (64, 96, 64)),       # the UNet's: 8 x 14 = 112 CTAs, one wave
    ((8192, 320, 320), (128, 160, 64)),      # 64 x 2 = 128 CTAs: one wave, N not padded
    ((2048, 5632, 2048), (128, 176, 64)),    # llama's: 16 x 32 = 512 CTAs, 4 waves (cuBLAS's)
])
def test_fitted_tiles_fill_the_waves_and_emit(shape, tile):
    p = _problem(*shape)
    fitted = sm90.fitted_configs(p, SMS)
    assert tile in {c.tile for c in fitted}
    multicast = set(sm90.multicast_configs(p, SMS))
    assert not (set(fitted) - multicast) & set(sm90.SPACE)
    for c in fitted:
        if c.n_split or c in multicast:     # tests/unit/test_n_split_gemm.py, below
            continue
        assert c.tile[1] % 16 == 0 and c.tile[1] not in sm90._FIXED_N[c.tile[0]]
        est = sm90.tile_estimate(shape[0], shape[1], c.tile[0], c.tile[1], SMS)
        best_fixed = min(sm90.tile_estimate(shape[0], shape[1], c.tile[0], n, SMS)
                         for n in sm90._FIXED_N[c.tile[0]])
        assert est * sm90.FIT_MIN_GAIN <= best_fixed
        code = gemm_sm90.emit(_kernel(c)).code
        assert f"cute::_{c.tile[1]}" in code


@pytest.mark.parametrize("tile, schedule, wide, epilogue_tile", [
    ((128, 128, 64), sm90.COOP, False, None),
    ((128, 192, 64), sm90.COOP, False, None),
    ((64, 96, 64), sm90.PINGPONG, False, None),
    ((128, 160, 64), sm90.COOP, True, None),          # gcd(32, 160) = 32: the automatic tile
    ((128, 176, 64), sm90.COOP, True, "cute::Shape<cute::_128, cute::_176>"),
    ((64, 80, 64), sm90.PINGPONG, True, "cute::Shape<cute::_64, cute::_80>"),
])
@pytest.mark.usefixtures("cutlass_tma_epilogue")
def test_tile_n_outside_the_default_wgmma_shapes_gets_its_own_mma_and_epilogue(
        tile, schedule, wide, epilogue_tile):
    """A tile N that CuTe's default wgmma shapes do not hold (176: the builder would run
    eleven 64x16 wgmmas) gets the selector specialized to the 64 x N atom, from the
    extended headers, and a static_assert that the builder took it; one that is an odd
    multiple of 16 stores through one tile-wide epilogue subtile instead of 16-column
    ones. Every other kernel's source stays as it was."""
    src = gemm_sm90.emit(_kernel(sm90._config(tile, (1, 1, 1), schedule)))
    n = tile[1]
    assert src.defines == gemm_sm90.GDC_DEFINES
    assert (set(sm90_parts.WGMMA_EXT_INCLUDES) <= set(src.includes)) == wide
    assert ("ss_op_selector" in src.code) == wide
    assert ("TiledMma::AtomShape_MNK{}) == %d" % n in src.code) == wide
    if wide:
        # before the kernel's namespace, for its dtype, tile and K-major A and B
        assert src.code.index("ss_op_selector") < src.code.index(f"namespace {src.name}")
        assert (f"ss_op_selector<cutlass::half_t, cutlass::half_t, float, cute::Shape<cute::_"
                f"{tile[0]}, cute::_{n}, cute::_64>,\n               Major::K, Major::K>()") in src.code
        assert f"return MMA_64x{n}x16_F32F16F16_SS<Major::K, Major::K>{{}};" in src.code
    if epilogue_tile is None:
        assert "cutlass::epilogue::collective::EpilogueTileAuto," in src.code
    else:
        assert "EpilogueTileAuto" not in src.code
        assert f"    {epilogue_tile},\n    ElementAccumulator" in src.code


def test_the_wgmma_selector_follows_dtype_and_operand_majors():
    cfg = sm90._config((128, 176, 64), (1, 1, 1), sm90.COOP)
    k = replace(_kernel(cfg), dtype="bf16", layout_b="row")
    code = sm90_parts.wgmma_selector(k)
    assert "ss_op_selector<cutlass::bfloat16_t, cutlass::bfloat16_t, float" in code
    assert "MMA_64x176x16_F32BF16BF16_SS<Major::K, Major::MN>" in code
    assert "#ifndef CO_WGMMA_bf16_KMN_128x176x64" in code       # kernels of a unit share it
    assert sm90_parts.wgmma_selector(_kernel(sm90.CONFIGS["mid"])) == ""
    with pytest.raises(ValueError, match="f16 / bf16"):
        sm90_parts.wgmma_selector(SimpleNamespace(config=cfg, dtype="f32", layout_a="row",
                                                  layout_b="col"))


def test_multicast_clusters_for_few_tiles_and_a_long_k():
    """The UNet's 512 x 3840 x 1280 (4 x 30 tiles of 128x128, K 20 tiles deep) gets
    clusters of 4 and 8 CTAs that divide its tile grid, among the fitted configs;
    a problem of many waves or a short K gets none, nor does a batched one."""
    p = _problem(512, 3840, 1280)
    mc = sm90.multicast_configs(p, SMS)
    assert ((128, 128, 64), (4, 2, 1)) in {(c.tile, c.cluster) for c in mc}
    assert set(mc) <= set(sm90.fitted_configs(p, SMS))
    for c in mc:
        m_tiles, n_tiles = -(-512 // c.tile[0]), -(-3840 // c.tile[1])
        assert m_tiles % c.cluster[0] == 0 and n_tiles % c.cluster[1] == 0
        assert c.cluster[0] * c.cluster[1] in (2, 4, 8) and sm90.plausible(p, c, SMS)
        source = gemm_sm90.emit(_kernel(c))
        assert f"cute::Shape<cute::_{c.cluster[0]}, cute::_{c.cluster[1]}, cute::_1>" in source.code
        # the persistent grid from the clusters the device holds (cluster_occupancy.h)
        assert f"dim3({c.cluster[0]}, {c.cluster[1]}, 1), co_clusters_known" in source.code
        assert gemm_sm90.CLUSTER_OCCUPANCY in source.preamble
    assert sm90.multicast_configs(_problem(8192, 8192, 8192), SMS) == ()     # 16 waves
    assert sm90.multicast_configs(_problem(512, 3840, 512), SMS) == ()       # short K
    assert sm90.multicast_configs(replace(p, batch=4), SMS) == ()
    with pytest.raises(ValueError, match="at most 8 CTAs"):
        gemm_sm90.emit(_kernel(replace(mc[0], cluster=(4, 4, 1))))
    # a 1x1 kernel's source is as before: no occupancy query, so its cache key holds
    plain = gemm_sm90.emit(_kernel(replace(mc[0], cluster=(1, 1, 1))))
    assert "co_max_active_clusters" not in plain.code
    assert gemm_sm90.CLUSTER_OCCUPANCY not in plain.preamble


def test_swap_ab_tiles_fitted_to_m_for_many_rows():
    """convnext-tiny's 1568 x 768 x 3072: cuBLAS's shape, 128 along N (6 tiles) and 80
    along M (20 tiles), in 1x1 and in 2x4 / 2x2 clusters that divide that grid (K >=
    1024), among the fitted configs; each emits a swap_ab kernel with its cluster."""
    p = _problem(1568, 768, 3072)
    sw = sm90._swap_fitted_configs(p, SMS)
    assert sw and all(c.swap_ab for c in sw) and set(sw) <= set(sm90.fitted_configs(p, SMS))
    assert {((128, 80, 64), c) for c in ((1, 1, 1), (2, 4, 1), (2, 2, 1))} <= {(c.tile, c.cluster) for c in sw}
    for c in sw:
        assert sm90.plausible(p, c, SMS) and sm90.takes(p, c)
        assert -(-768 // c.tile[0]) % c.cluster[0] == 0 and -(-1568 // c.tile[1]) % c.cluster[1] == 0
        source = gemm_sm90.emit(_kernel(c))
        assert f"cute::Shape<cute::_{c.cluster[0]}, cute::_{c.cluster[1]}, cute::_1>" in source.code
    # a short K: no clusters; few rows: the skinny-M swap_configs' job; bf16 alike; not for
    # a row-major B (swap_ab needs K-contiguous operands) nor a batch
    assert all(c.cluster == (1, 1, 1) for c in sm90._swap_fitted_configs(_problem(1568, 768, 768), SMS))
    assert sm90._swap_fitted_configs(_problem(200, 768, 3072), SMS) == ()
    assert sm90._swap_fitted_configs(replace(p, layout_b="row"), SMS) == ()
    assert sm90._swap_fitted_configs(replace(p, batch=4), SMS) == ()
    assert sm90._swap_fitted_configs(_problem(1568, 768, 3072, dtype="bf16"), SMS) == sw
    # where the fixed tiles fill the waves already, none
    assert sm90._swap_fitted_configs(_problem(4096, 4096, 4096), SMS) == ()


def test_no_fitted_tiles_where_fixed_ones_fill_or_cannot_apply():
    assert sm90.fitted_configs(_problem(4096, 4096, 4096), SMS) == ()      # 256 CTAs of 128x256
    # one row of tiles: no fitted tile of the problem's orientation, only swap_ab ones
    assert all(c.swap_ab for c in sm90.fitted_configs(_problem(77, 1280, 768), SMS))
    row_b = replace(_problem(2048, 5632, 2048), layout_b="row")
    assert sm90.fitted_configs(row_b, SMS) == ()


def test_launch_variants_default_first_stream_k_decompositions_only_on_stream_k():
    big = _problem(4096, 4096, 4096)
    v = sm90.launch_variants(sm90.CONFIGS["mid"], big, SMS)
    assert v[0] == GemmLaunch() and len(set(v)) == len(v)
    assert {x.raster for x in v} == {"heuristic", "along_m", "along_n"}
    assert all(x.decomposition == "heuristic" and not x.pdl for x in v)
    few_tiles = _problem(128, 1280, 5120)
    sk = sm90.launch_variants(sm90.CONFIGS["stream_k"], few_tiles, SMS)
    assert {x.decomposition for x in sk} == {"heuristic", "data_parallel", "stream_k", "split_k"}
    assert {x.splits for x in sk if x.decomposition == "split_k"} == {2, 3, 4}
    assert sm90.launch_variants(sm90.CONFIGS["mid"], few_tiles, SMS) == (GemmLaunch(),)


def _table(entries, num_sms=SMS):
    from cutlass_offload.tune.result import config_to_dict
    return sm90.Table({"gpu": "NVIDIA H200", "num_sms": num_sms, "entries": [
        {"m": m, "n": n, "k": k, "batch": 1, "layout_b": "col", "config": config_to_dict(c),
         "launch": launch} for (m, n, k), c, launch in entries]})


def test_table_lookup_exact_then_nearest_within_2x_else_rules():
    wide, narrow = sm90.CONFIGS["wide"], sm90.CONFIGS["narrow"]
    t = _table([((1024, 768, 768), wide, {"raster": "along_n", "pdl": True}),
                ((8192, 768, 768), narrow, {})])
    assert t.lookup(_problem(1024, 768, 768), SMS) == (wide, GemmLaunch(raster="along_n", pdl=True))
    assert t.lookup(_problem(1500, 768, 768), SMS)[0] == wide           # nearest (log distance)
    assert t.lookup(_problem(6000, 768, 768), SMS)[0] == narrow
    assert t.lookup(_problem(1024, 768, 3072), SMS) is None              # K 4x away
    assert t.lookup(_problem(1024, 768, 768), 114) is None               # another SM count
    row_b = GemmProblem(n=768, k=768, dtype="f16", layout_b="row", align_a=8, align_b=8, align_c=8,
                        m=1024, m_hint=1024)
    assert t.lookup(row_b, SMS) is None
    # choose: the table first, the rules for what it does not cover
    assert sm90.choose(_problem(1024, 768, 768), SMS, t)[0] == wide
    assert sm90.choose(_problem(1024, 768, 3072), SMS, t) == (sm90.CONFIGS["small"], sm90.DEFAULT_LAUNCH)
    assert sm90.choose(_problem(1024, 768, 768), SMS, None)[0] == sm90.CONFIGS["small"]
    # a batched problem is looked up by all its rows (M x batch)
    batched = replace(_problem(128, 768, 768), batch=8, batch_hint=8)
    assert t.lookup(batched, SMS)[0] == wide


def test_packaged_table_names_its_gpu_and_loads():
    t = sm90.default_table()
    if t is None:
        pytest.skip("no learned table packaged yet")
    assert t.num_sms == SMS and "H200" in t.gpu and t.meta.get("cutlass") and t.meta.get("date")
    assert t.entries
    for config, launch in t.entries.values():
        gemm_sm90.emit(replace(_kernel(config), launch=launch))


def test_learned_table_keys_the_a_layout():
    """The table's winners are keyed by A's layout too: a column-major A (a Linear on a
    transposed view) takes an entry measured on a column-major A, else the shape rules,
    never a row-major A's winner; and its kernel emits ColumnMajor A."""
    row = _problem(2048, 5632, 2048)
    col = replace(row, layout_a="col")
    assert sm90.default_table().lookup(row, SMS) is not None
    assert sm90.default_table().lookup(col, SMS) is None
    k = choose_kernel(col, "sm90a")
    assert k.layout_a == "col" and k.config == choose_kernel(col, "sm90a", table=False).config
    vae = replace(_problem(4096, 1536, 512), layout_a="col")      # the VAE's attention projections
    assert sm90.default_table()._key(vae, SMS) == (4096, 1536, 512, "col", "col")
    assert sm90.default_table()._key(replace(vae, layout_a="row"), SMS)[-1] == "row"
    code = gemm_sm90.emit(k).code
    assert "using LayoutA = cutlass::layout::ColumnMajor;" in code
    assert "cute::make_stride(cute::_1{}, int64_t(args.lda), int64_t(args.batch_stride_a))" in code
    assert "using LayoutA = cutlass::layout::RowMajor;" in gemm_sm90.emit(choose_kernel(row, "sm90a")).code


def test_skinny_tiles_fit_a_narrow_n_or_short_k_of_many_rows():
    # EfficientNet's first 1x1 convs as GEMMs: N and K rounded up to 16, no 64-deep K tile
    tags = [c.tag for c in sm90.skinny_configs(_problem(401408, 16, 32), SMS)]
    assert tags == ["64x16x32_c1x1x1_pingpong", "128x16x32_c1x1x1_pingpong",
                    "128x16x32_c1x1x1_coop", "256x16x32_c1x1x1_coop"]
    assert {c.tile for c in sm90.skinny_configs(_problem(401408, 96, 16), SMS)} >= {(256, 96, 16)}
    # no tile with more than 128 accumulators per consumer thread
    for c in sm90.skinny_configs(_problem(100352, 144, 24), SMS):
        per_thread = c.tile[0] * c.tile[1] // (128 if c.kernel_schedule == sm90.PINGPONG else 256)
        assert per_thread <= 128, c.tag
    # proposed by the wave-fitted search, emitted like any config
    fitted = sm90.fitted_configs(_problem(401408, 16, 32), SMS)
    assert set(sm90.skinny_configs(_problem(401408, 16, 32), SMS)) <= set(fitted)
    for c in fitted:
        gemm_sm90.emit(GemmKernel("sm90a", "f16", "col", 8, 8, 8, GemmEpilogue(bias=True), c))
    # not for few rows, nor for a problem wide and deep enough for the fixed tiles
    assert sm90.skinny_configs(_problem(4096, 16, 32), SMS) == ()
    assert sm90.skinny_configs(_problem(401408, 96, 96), SMS) == ()


def test_a_gemm_left_to_the_2x_kernels_on_sm90a_says_why():
    """An sm_90a build whose GEMM cannot take a TMA kernel runs a CUTLASS 2.x one; the
    region's note says which operand's alignment decided it (a fresh-user trial,
    session 50: a width of 1020 moved to sm80 kernels with no word in the report)."""
    import torch
    import torch.nn as nn

    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions
    from cutlass_offload.partition import partition
    from cutlass_offload.select import select
    m = nn.Sequential(nn.Linear(64, 36), nn.ReLU(), nn.Linear(36, 64), nn.Linear(64, 64)).half()
    opts = CompileOptions(arch="sm90a")
    plan = select(partition(capture(m, (torch.randn(8, 64).half(),)).graph_module, opts), "sm90a", opts)
    notes = {k.config.family: [n for n in r.notes if "2.x" in n] for r, k in plan.pairs}
    assert [n for n in notes["cutlass2x_sm80"]] and all("aligned to" in n for n in notes["cutlass2x_sm80"])
    assert notes["cutlass3x_sm90"] == []                 # the aligned GEMM: no such note
    assert sm90.refusal(plan.pairs[-1][0].problem) is None
