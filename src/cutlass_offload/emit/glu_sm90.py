"""The GLU epilogue of a CUTLASS 3.x sm90a GEMM (``ir.GemmEpilogue.glu``): the pieces
gemm_sm90's GLU_TEMPLATE splices in place of the collective builder's TMA epilogue.

The GEMM's B holds the gate and up projections' rows interleaved in blocks of 8
(partition/gated_gemm.py), so a tile of N columns gives N / 2 outputs
``D = act(gate + bias_gate) * (up + bias_up)``, rounded as PyTorch's separate ops round.
Three store forms:

* registers (GLU_STAGED False): each thread stores its column pairs
  (templates/glu_epilogue.h; the form measured on the H200 in sessions 23-25);
* staged (GLU_STAGED True, the default since session 37): the products go through a
  shared-memory tile and leave in 16-byte row chunks (templates/glu_epilogue.h). On an
  H100 it ran 1.01-1.48x faster than the register form on the UNet's four GEGLU
  projections and llama's SwiGLU pair and passed tests/gpu/test_glu_gemm.py
  (benchmarks/results/glu_epilogue_2026-12-05_h100_s37.*);
* TMA (GLU_TMA): the products staged in TMA's swizzled boxes and stored by TMA
  (templates/staged_tma_epilogue.h with Glu_), for tiles whose output width (tile N / 2)
  is a multiple of 16. Not yet run on a GPU (session 39).
"""
from __future__ import annotations

import string
from pathlib import Path

from ..ir import GemmKernel
from . import activations, sm90_parts, staged

H = (Path(__file__).parent / "templates" / "glu_epilogue.h").read_text()
GLU_STAGED = True
# None: as the staged epilogues' form says (staged.form() == "tma", which follows
# CUTLASS_OFFLOAD_STAGED_EPILOGUE); True / False: on / off whatever it says.
GLU_TMA: bool | None = None
INCLUDES = staged.INCLUDES      # the adapter, the type names, the converter

# In place of sm90_parts.EPILOGUE in gemm_sm90's text.
EPILOGUE = """\
using ClusterShape = cute::Shape<cute::_${cluster_m}, cute::_${cluster_n}, cute::_${cluster_k}>;

// Epilogue: ${epilogue_tag}: gate and up columns interleaved in blocks of 8, the product
// ${glu_store}; the mainloop's stages are counted after its shared memory
using CollectiveEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
    ${glu_epilogue}>;

"""
_ROWS = """co_glu::GluEpilogue<ElementD, ElementBias, ${act}, ${bias},
                        cutlass::epilogue::NoSmemWarpSpecialized, TileShape, ${staged}>"""
_TMA = """co_staged::TmaStagedEpilogue<void, ElementD, ElementBias, ${act}, ${has_act}, ${bias}, 0,
                        cutlass::epilogue::thread::Identity, false, cutlass::epilogue::NoSmemWarpSpecialized,
                        TileShape, ${stride}, ${knobs}, true>"""


def glu_tma(kernel: GemmKernel) -> bool:
    """Whether ``kernel``'s GLU epilogue stores through TMA (GLU_TMA, or where it is
    None the staged epilogues' TMA form; its output width, tile N / 2, a multiple of 16)."""
    on = GLU_TMA if GLU_TMA is not None else staged.form() == "tma"
    return kernel.epilogue.glu and on and (kernel.config.tile[1] // 2) % 16 == 0


def values(kernel: GemmKernel) -> dict:
    """EPILOGUE's own placeholders for a GLU ``kernel``: ``glu_epilogue`` (the epilogue
    class) and ``glu_store`` (its store form, for the comment)."""
    ep, cfg = kernel.epilogue, kernel.config
    act = activations.FUNCTOR[ep.activation] or staged.IDENTITY
    bias = "true" if ep.bias else "false"
    if glu_tma(kernel):
        text = string.Template(_TMA).substitute(
            act=act, has_act="false" if act == staged.IDENTITY else "true", bias=bias,
            stride=staged.GEMM_STRIDE, knobs=staged.tma_knobs(sm90_parts.consumer_groups(cfg)))
        store = "staged in TMA's swizzled boxes and stored by TMA (templates/staged_tma_epilogue.h)"
    else:
        text = string.Template(_ROWS).substitute(act=act, bias=bias, staged="true" if GLU_STAGED else "false")
        store = ("staged in shared memory, stored in 16-byte row chunks (templates/glu_epilogue.h)"
                 if GLU_STAGED else "written from registers (templates/glu_epilogue.h)")
    return {"glu_epilogue": text, "glu_store": store}


def headers(kernel: GemmKernel) -> str:
    """The template headers a GLU ``kernel`` needs ahead of its code: what the staged
    epilogues share, then the TMA-store or the GLU epilogue (each guarded)."""
    return staged.COMMON_H + (staged.TMA_STAGED_H if glu_tma(kernel) else H)
