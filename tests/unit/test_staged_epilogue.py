"""The staged elementwise epilogue's emission (emit/staged.py ENABLED,
emit/templates/staged_epilogue.h): which kernels take it, what their source carries,
and that with the switch off every kernel's source is what it was."""
import pytest

from cutlass_offload.emit import gemm_sm90, staged
from cutlass_offload.ir import GemmEpilogue, GemmKernel
from cutlass_offload.select import sm90

PINGPONG = sm90._config((128, 128, 64), (1, 1, 1), sm90.PINGPONG)


def _kernel(ep=GemmEpilogue(bias=True, activation="gelu_erf"), cfg=PINGPONG, dtype="f16"):
    return GemmKernel(arch="sm90a", dtype=dtype, layout_b="col", align_a=8, align_b=8, align_c=8,
                      epilogue=ep, config=cfg)


@pytest.fixture
def enabled(monkeypatch):
    monkeypatch.setattr(staged, "ENABLED", True)


def test_off_by_default_and_then_the_tma_epilogue():
    assert not gemm_sm90.staged_epilogue_applies(_kernel())
    code = gemm_sm90.emit(_kernel()).code
    assert "co_staged" not in code and "epilogue::collective::CollectiveBuilder" in code


@pytest.mark.parametrize("ep, args", [
    (GemmEpilogue(bias=True, activation="gelu_erf"),
     "co_act::GELU, true,\n                              true, 0, cutlass::epilogue::thread::Identity, false,"),
    (GemmEpilogue(bias=True, activation="relu", residual="add", post_activation="relu"),
     "cutlass::epilogue::thread::ReLu, true,\n                              true, 1, "
     "cutlass::epilogue::thread::ReLu, true,"),
    (GemmEpilogue(activation="silu", residual="mul"),
     "co_act::SiLU, true,\n                              false, 2, cutlass::epilogue::thread::Identity, false,"),
    (GemmEpilogue(),
     "cutlass::epilogue::thread::Identity, false,\n                              false, 0, "
     "cutlass::epilogue::thread::Identity, false,"),
])
def test_the_epilogue_maps_to_the_template_arguments(enabled, ep, args):
    k = _kernel(ep)
    assert gemm_sm90.staged_epilogue_applies(k)
    src = gemm_sm90.emit(k)
    assert args in src.code
    assert src.code.count("#ifndef CO_STAGED_EPILOGUE_H") == 1
    assert "epilogue::collective::CollectiveBuilder" not in src.code
    assert "cutlass/numeric_conversion.h" in src.includes
    # the bias pointer goes to the epilogue's own arguments; no EVT arguments
    assert ("arguments.epilogue.thread.bias = static_cast<ElementBias const*>(args.bias);" in src.code) == ep.bias
    assert "EVT arguments" not in src.code
    # a residual reads C (and checks it is 16-byte aligned like TMA did)
    assert ("static_cast<ElementC const*>(args.c)" in src.code) == (ep.residual != "none")


@pytest.mark.parametrize("why, kernel", [
    ("tf32", _kernel(dtype="f32")),
    ("swap AB (a transposed D)", _kernel(cfg=sm90._config((128, 64, 64), (1, 1, 1), sm90.COOP, swap_ab=True))),
    ("GLU", _kernel(GemmEpilogue(activation="silu", glu=True))),
    ("broadcast residual", _kernel(GemmEpilogue(residual="add", residual_broadcast=True))),
])
def test_kernels_that_keep_their_epilogue(enabled, why, kernel):
    assert not gemm_sm90.staged_epilogue_applies(kernel), why


def test_the_two_forms_are_different_sources(monkeypatch):
    # the kernel cache keys objects by source: the forms never serve each other
    k = _kernel()
    tma = gemm_sm90.emit(k).code
    monkeypatch.setattr(staged, "ENABLED", True)
    assert gemm_sm90.emit(k).code != tma


@pytest.mark.parametrize("tile_n", [128, 176, 96, 16])
def test_the_tma_store_form_for_tiles_of_whole_16_column_chunks(enabled, monkeypatch, tile_n):
    monkeypatch.setattr(staged, "STORE", "tma")
    assert not staged.tma_store(200)     # (the emitters' tiles are all multiples of 16)
    tma = staged.tma_store(tile_n)
    cfg = sm90._config((128, tile_n, 64), (1, 1, 1), sm90.PINGPONG)
    code = gemm_sm90.emit(_kernel(cfg=cfg)).code
    assert ("co_staged::TmaStagedEpilogue<" in code) == tma
    assert ("co_staged::StagedEpilogue<" in code) == (not tma)
    if tma:
        # the widest chunk, the boxes in flight and the groups (one: ping-pong) are its
        # last template arguments
        assert f"{staged.GEMM_STRIDE}, {staged.TMA_MAX_CHUNK_COLS}, {staged.TMA_BUFFERS}, 1>>;" in code
    assert code.count("#ifndef CO_STAGED_TMA_EPILOGUE_H") == 1


def test_the_store_forms_are_different_sources(enabled, monkeypatch):
    monkeypatch.setattr(staged, "STORE", "rows")
    rows = gemm_sm90.emit(_kernel()).code
    monkeypatch.setattr(staged, "STORE", "tma")
    assert gemm_sm90.emit(_kernel()).code != rows


def test_the_tma_store_form_gives_a_cooperative_kernel_a_region_per_warp_group(enabled, monkeypatch):
    monkeypatch.setattr(staged, "STORE", "tma")
    code = gemm_sm90.emit(_kernel(cfg=sm90._config((256, 128, 64), (1, 1, 1), sm90.COOP))).code
    assert f"{staged.GEMM_STRIDE}, {staged.TMA_MAX_CHUNK_COLS}, {staged.TMA_BUFFERS}, 2>>;" in code


@pytest.mark.parametrize("value, form", [("", None), ("0", None), ("1", "tma"), ("tma", "tma"), ("rows", "rows")])
def test_the_environment_knob_switches_the_staged_epilogues(monkeypatch, value, form):
    from cutlass_offload.emit import attention_sm90
    monkeypatch.setenv("CUTLASS_OFFLOAD_STAGED_EPILOGUE", value)
    assert staged.form() == form
    assert gemm_sm90.staged_epilogue_applies(_kernel()) == (form is not None)
    code = gemm_sm90.emit(_kernel()).code
    assert ("co_staged::TmaStagedEpilogue<" in code) == (form == "tma")
    assert ("co_staged::StagedEpilogue<" in code) == (form == "rows")
    assert attention_sm90.staged_o()          # the FMHA's O store is staged whatever it says


def test_a_bad_knob_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_STAGED_EPILOGUE", "fast")
    with pytest.raises(ValueError, match="CUTLASS_OFFLOAD_STAGED_EPILOGUE='fast'"):
        staged.form()
