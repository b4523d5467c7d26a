"""Build tier: the Hopper FMHA with its output stored by the staged epilogue
(emit/templates/fmha_staged_epilogue.h, behind emit/attention_sm90.STAGED_EPILOGUE)
compiles: the kernel composed from the example builder's mainloop and tile scheduler
with co_fmha::StagedFwdEpilogue (its static_asserts check the accumulator layout and
that the staged tile fits a warp group's Q stage), for the SD UNet's head dim 40 on
the 3-warp-group 192-query tile, a persistent ping-pong kernel with the
heaviest-first causal scheduler, and the UNet's head dims 80 (ping-pong) and 160
(cooperative), whose P.V accumulators span the head tile in several wgmmas (MMA_N >
1: session 39's cold sd-unet build found them failing the epilogue's layout check),
one unit, with the kernels of test_attention_lpt_build.py and
test_attention_sm90_build.py (hopper_fmha.py's one build).
tests/gpu/test_attention_sm90.py runs it."""
from pathlib import Path

import pytest
from build_helpers import kernel_units, library_exports

pytestmark = pytest.mark.build


def test_staged_fmha_epilogue_kernels_compile(hopper_fmha_built):
    plan, res = hopper_fmha_built
    assert plan.regions[0].problem.head_dim == 40                # the UNet's
    assert plan.kernels[0].config.tile[0] == 192                 # three consumer warp groups
    units = kernel_units(res)
    assert len({k.name for k in plan.kernels}) == len(plan.kernels) == 9
    source = "".join(Path(u.source).read_text() for u in units)
    assert source.count("co_fmha::StagedFwdEpilogue<") == len(plan.kernels)   # every kernel's
    assert "#ifndef CO_FMHA_STAGED_EPILOGUE_H" in source         # one copy compiled per unit
    library_exports(res, plan)
