"""benchmarks/staged_epilogue.py's --staged-variants parsing (no GPU): row-store and
TMA-store forms, and the errors on values emit/staged.py's templates do not take."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import staged_epilogue as bench  # noqa: E402

from cutlass_offload.emit import staged  # noqa: E402


def test_row_and_tma_forms():
    forms = bench.variant_forms(f"{staged.MAX_CHUNK_GROUPS}x{staged.BUFFERS},32x1, TMA64x2,tma16x4")
    assert forms == {"staged": ("rows", staged.MAX_CHUNK_GROUPS, staged.BUFFERS),
                     "staged_g32_b1": ("rows", 32, 1),
                     "staged_tma64_b2": ("tma", 64, 2),
                     "staged_tma16_b4": ("tma", 16, 4)}


@pytest.mark.parametrize("spec", ["tma48x2", "tma64x5", "12x3", "0x1", "tma", "12"])
def test_values_the_templates_do_not_take(spec):
    with pytest.raises(SystemExit, match="--staged-variants"):
        bench.variant_forms(spec)


def test_the_baseline_is_the_tma_epilogue_whatever_the_environment_says(monkeypatch):
    # the "tma" form's plan is built with staged.ENABLED False: $CUTLASS_OFFLOAD_STAGED_EPILOGUE
    # must not turn the baseline into a staged build
    from cutlass_offload.emit import gemm_sm90
    monkeypatch.setenv("CUTLASS_OFFLOAD_STAGED_EPILOGUE", "1")
    monkeypatch.setattr(staged, "ENABLED", False)
    plan, _ = bench.plan_for(132, "tma")
    assert not any(gemm_sm90.staged_epilogue_applies(k) for k in plan.kernels)
    monkeypatch.setattr(staged, "ENABLED", None)
    assert all(gemm_sm90.staged_epilogue_applies(k) for k in plan.kernels)
