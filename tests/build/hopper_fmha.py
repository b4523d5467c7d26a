"""The build tier's one build of Hopper FMHA kernels (emit/attention_sm90.py, the
staged O store of emit/templates/fmha_staged_epilogue.h): every kernel in one plan,
built once per session (conftest.py's ``hopper_fmha_built``), one unit:

* test_attention_staged_epilogue_build.py's kinds: the SD UNet's head dim 40 on the
  3-warp-group 192-query tile, a persistent ping-pong kernel with the heaviest-first
  causal scheduler (bf16), and the UNet's head dims 80 (ping-pong) and 160
  (cooperative);
* the kernels that test_attention_lpt_build.py's and test_attention_sm90_build.py's
  models select (their problems: LPT_TEST, HD40_TEST). The staged O store is the
  default, so those tests' compiles find these kernels compiled (the kernel index,
  build.sharded) and link this unit, compiling only their launchers;
* a causal kernel with a tanh soft-cap on the logits (Gemma 2's; SOFTCAP);
* a causal grouped-query kernel reading K and V in place, 4 query heads per K/V head
  (llama's attention; GQA; templates/fmha_gqa_mainloop.h);
* Gemma 2's sliding-window layer: causal within a window of 128 keys, soft-capped,
  2 query heads per K/V head (WINDOW; the window and soft-cap fusions composed).

On the 2-core machine (nvcc 13.0, 2026-12) the six kernels' unit compiled in 100 s;
as the three tests' own units (four kernels, one, one) they took 104 + 43 + 38 s."""
import pytest
from build_helpers import build_one_job

from cutlass_offload.emit import attention_sm90 as emit_a90
from cutlass_offload.families import attention_sm90
from cutlass_offload.ir import AttentionRegion, Plan
from cutlass_offload.ir.attention import AttentionProblem

UNET = AttentionProblem(heads=8, seq_q=4096, seq_kv=4096, head_dim=40, head_dim_v=40, dtype="f16",
                        scale=40 ** -0.5, batch=2)
CAUSAL = AttentionProblem(heads=4, seq_q=512, seq_kv=512, head_dim=64, head_dim_v=64, dtype="bf16",
                          scale=0.125, batch=2, causal="top_left")
HD80 = AttentionProblem(heads=10, seq_q=1024, seq_kv=1024, head_dim=80, head_dim_v=80, dtype="f16",
                        scale=80 ** -0.5, batch=2)
HD160 = AttentionProblem(heads=8, seq_q=256, seq_kv=77, head_dim=160, head_dim_v=160, dtype="f16",
                         scale=160 ** -0.5, batch=2)
# test_attention_lpt_build.py's causal attention (B, N, S, E = 2, 4, 256, 64) and
# test_attention_sm90_build.py's self-attention (2, 8, 64, 40)
LPT_TEST = AttentionProblem(heads=4, seq_q=256, seq_kv=256, head_dim=64, head_dim_v=64, dtype="f16",
                            scale=64 ** -0.5, batch=2, causal="top_left")
HD40_TEST = AttentionProblem(heads=8, seq_q=64, seq_kv=64, head_dim=40, head_dim_v=40, dtype="f16",
                             scale=40 ** -0.5, batch=2)
# Gemma 2's causal attention with its logits soft-capped at 50 (test_attention_softcap_build.py)
SOFTCAP = AttentionProblem(heads=4, seq_q=256, seq_kv=256, head_dim=64, head_dim_v=64, dtype="f16",
                           scale=0.125, batch=2, causal="top_left", softcap=50.0)

# llama-style grouped-query attention: 8 query heads, 2 K/V heads (test_attention_gqa_build.py)
GQA = AttentionProblem(heads=8, seq_q=256, seq_kv=256, head_dim=64, head_dim_v=64, dtype="f16",
                       scale=0.125, batch=2, causal="top_left", kv_group=4)

# Gemma 2's sliding-window layer: a window of 128 keys, soft-cap 50, 2 query heads per
# K/V head (test_attention_window_build.py)
WINDOW = AttentionProblem(heads=8, seq_q=256, seq_kv=256, head_dim=64, head_dim_v=64, dtype="f16",
                          scale=0.125, batch=2, causal="top_left", softcap=50.0, kv_group=2,
                          window=128)


def _region(name, problem):
    return AttentionRegion(name=name, form="sdpa", nodes=(name,), q="q", k="k", v="v", problem=problem,
                           anchor=name)


def plan() -> Plan:
    lpt = next(c for c in attention_sm90.CONFIGS if c.tile_scheduler == "lpt"
               and c.kernel_schedule == attention_sm90.PINGPONG and c.tile[2] == 64)
    pick = {hd: next(c for c in attention_sm90.CONFIGS if c.tile_scheduler != "lpt" and c.tile[2] == hd
                     and c.kernel_schedule == sched and c.tile[0] == 128)
            for hd, sched in ((80, attention_sm90.PINGPONG), (160, attention_sm90.SCHEDULE))}
    pairs = (("unet", UNET, attention_sm90.choose(UNET)),
             ("causal", CAUSAL, attention_sm90.choose(CAUSAL, config=lpt)),
             ("hd80", HD80, attention_sm90.choose(HD80, config=pick[80])),
             ("hd160", HD160, attention_sm90.choose(HD160, config=pick[160])),
             ("lpt_test", LPT_TEST, attention_sm90.choose(LPT_TEST)),
             ("hd40_test", HD40_TEST, attention_sm90.choose(HD40_TEST)),
             ("softcap", SOFTCAP, attention_sm90.choose(SOFTCAP)),
             ("gqa", GQA, attention_sm90.choose(GQA)),
             ("window", WINDOW, attention_sm90.choose(WINDOW)))
    return Plan("sm90a", tuple(_region(n, p) for n, p, _ in pairs), tuple(k for _, _, k in pairs), ())


def build(cache_dir):
    """(plan, BuildResult): ``plan()`` built with one nvcc job, the staged O store on."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(emit_a90, "STAGED_EPILOGUE", True)
        p = plan()
        return p, build_one_job(cache_dir, p)
