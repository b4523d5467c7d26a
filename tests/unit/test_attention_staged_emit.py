"""emit/attention_sm90.py with STAGED_EPILOGUE: the Hopper FMHA composed from the
example builder's mainloop and tile scheduler with co_fmha::StagedFwdEpilogue
(templates/fmha_staged_epilogue.h) storing O, the default since session 42; off, the
emitted kernel is the builder's own. No nvcc: tests/build/test_attention_staged_epilogue_build.py
compiles it."""
import pytest

from cutlass_offload.emit import attention_sm90 as emit_a90
from cutlass_offload.families import attention_sm90
from cutlass_offload.ir.attention import AttentionProblem

UNET = AttentionProblem(heads=8, seq_q=4096, seq_kv=4096, head_dim=40, head_dim_v=40, dtype="f16",
                        scale=40 ** -0.5, batch=2)
CAUSAL = AttentionProblem(heads=4, seq_q=512, seq_kv=512, head_dim=64, head_dim_v=64, dtype="f16",
                          scale=0.125, batch=2, causal="top_left")


def _lpt(schedule):
    return next(c for c in attention_sm90.CONFIGS
                if c.tile_scheduler == "lpt" and c.kernel_schedule == schedule and c.tile[2] == 64)


@pytest.mark.usefixtures("cutlass_tma_epilogue")
def test_off_the_kernel_is_the_builders():
    code = emit_a90.emit(attention_sm90.choose(UNET)).code
    assert "StagedFwdEpilogue" not in code and "CO_FMHA_STAGED_EPILOGUE_H" not in code
    assert "cutlass::fmha::kernel::FmhaBuilder<" in code and ">::Kernel;" in code


def test_the_staged_o_store_is_the_default_whatever_the_variable_says(monkeypatch):
    """$CUTLASS_OFFLOAD_STAGED_EPILOGUE switches the GEMMs', convs' and GLUs' forms only."""
    for value in ("", "0", "1", "rows"):
        monkeypatch.setenv("CUTLASS_OFFLOAD_STAGED_EPILOGUE", value)
        assert emit_a90.staged_o()
        assert "co_fmha::StagedFwdEpilogue<" in emit_a90.emit(attention_sm90.choose(UNET)).code


def test_on_the_builders_mainloop_and_scheduler_with_the_staged_epilogue(monkeypatch):
    monkeypatch.setattr(emit_a90, "STAGED_EPILOGUE", True)
    code = emit_a90.emit(attention_sm90.choose(UNET)).code
    assert code.index("#ifndef CO_STAGED_COMMON_H") < code.index("#ifndef CO_FMHA_STAGED_EPILOGUE_H")
    assert code.index("#ifndef CO_FMHA_STAGED_EPILOGUE_H") < code.index("using Kernel =")
    assert ("co_fmha::StagedFwdEpilogue<Element, float, typename Builder::CollectiveMainloop::TileShapePV>"
            in code)
    assert "typename Builder::TileScheduler" in code and "kIsPersistent" not in code


def test_on_the_heaviest_first_schedulers_keep_their_options(monkeypatch):
    monkeypatch.setattr(emit_a90, "STAGED_EPILOGUE", True)
    persistent = emit_a90.emit(attention_sm90.choose(CAUSAL, config=_lpt(attention_sm90.PINGPONG))).code
    assert "co_fmha::LptPersistentTileScheduler" in persistent and "kIsPersistent, cute::true_type" in persistent
    assert "co_fmha::StagedFwdEpilogue<" in persistent
    individual = emit_a90.emit(attention_sm90.choose(CAUSAL, config=_lpt(attention_sm90.COOPERATIVE))).code
    assert "co_fmha::LptIndividualTileScheduler" in individual and "kIsPersistent" not in individual
