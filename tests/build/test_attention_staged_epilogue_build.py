"""Build tier: the Hopper FMHA with its output stored by the staged epilogue
(emit/templates/fmha_staged_epilogue.h, behind emit/attention_sm90.STAGED_EPILOGUE)
compiles: the kernel composed from the example builder's mainloop and tile scheduler
with co_fmha::StagedFwdEpilogue (its static_asserts check the accumulator layout and
that the staged tile fits a warp group's Q stage), for the SD UNet's head dim 40 on
the 3-warp-group 192-query tile, a persistent ping-pong kernel with the
heaviest-first causal scheduler, and the UNet's head dims 80 (ping-pong) and 160
(cooperative), whose P.V accumulators span the head tile in several wgmmas (MMA_N >
1: session 39's cold sd-unet build found them failing the epilogue's layout check),
one unit. tests/gpu/test_attention_sm90.py runs it."""
from pathlib import Path

import pytest
from build_helpers import build_one_job, kernel_units, library_exports

from cutlass_offload.emit import attention_sm90 as emit_a90
from cutlass_offload.families import attention_sm90
from cutlass_offload.ir import AttentionRegion, Plan
from cutlass_offload.ir.attention import AttentionProblem

pytestmark = pytest.mark.build


def _region(name, problem):
    return AttentionRegion(name=name, form="sdpa", nodes=(name,), q="q", k="k", v="v", problem=problem,
                           anchor=name)


def test_staged_fmha_epilogue_kernels_compile(cache_dir, monkeypatch):
    monkeypatch.setattr(emit_a90, "STAGED_EPILOGUE", True)
    unet = AttentionProblem(heads=8, seq_q=4096, seq_kv=4096, head_dim=40, head_dim_v=40, dtype="f16",
                            scale=40 ** -0.5, batch=2)
    causal = AttentionProblem(heads=4, seq_q=512, seq_kv=512, head_dim=64, head_dim_v=64, dtype="bf16",
                              scale=0.125, batch=2, causal="top_left")
    lpt = next(c for c in attention_sm90.CONFIGS
               if c.tile_scheduler == "lpt" and c.kernel_schedule == attention_sm90.PINGPONG and c.tile[2] == 64)
    hd80 = AttentionProblem(heads=10, seq_q=1024, seq_kv=1024, head_dim=80, head_dim_v=80, dtype="f16",
                            scale=80 ** -0.5, batch=2)
    hd160 = AttentionProblem(heads=8, seq_q=256, seq_kv=77, head_dim=160, head_dim_v=160, dtype="f16",
                             scale=160 ** -0.5, batch=2)
    pick = {hd: next(c for c in attention_sm90.CONFIGS if c.tile_scheduler != "lpt" and c.tile[2] == hd
                     and c.kernel_schedule == sched and c.tile[0] == 128)
            for hd, sched in ((80, attention_sm90.PINGPONG), (160, attention_sm90.SCHEDULE))}
    kernels = (attention_sm90.choose(unet), attention_sm90.choose(causal, config=lpt),
               attention_sm90.choose(hd80, config=pick[80]), attention_sm90.choose(hd160, config=pick[160]))
    assert kernels[0].config.tile[0] == 192                      # three consumer warp groups
    plan = Plan("sm90a", (_region("unet", unet), _region("causal", causal), _region("hd80", hd80),
                          _region("hd160", hd160)), kernels, ())
    res = build_one_job(cache_dir, plan)
    units = kernel_units(res)
    source = "".join(Path(u.source).read_text() for u in units)
    assert source.count("co_fmha::StagedFwdEpilogue<") == 4
    assert "#ifndef CO_FMHA_STAGED_EPILOGUE_H" in source         # one copy compiled per unit
    library_exports(res, plan)
