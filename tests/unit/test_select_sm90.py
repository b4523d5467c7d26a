"""sm90a GEMM kernel choice (no nvcc, no GPU): the shape heuristic, the candidate
set for --tune, and the stream-K tile scheduler in the config and the emitter."""
import pytest

from cutlass_offload.emit import gemm_sm90
from cutlass_offload.ir import GemmEpilogue, GemmKernel, GemmProblem, KernelConfig
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
    return choose_kernel(_problem(m, n, k, **kw), "sm90a").config


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
    assert choose_kernel(_problem(1024, 3072, 768), "sm90a", num_sms=64).config == sm90.CONFIGS["big"]


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
