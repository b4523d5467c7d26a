"""The staged elementwise epilogue of the sm90 GEMM and conv kernels
(templates/staged_epilogue.h, after templates/staged_common.h), in place of the
collective builder's TMA epilogue and its fusion callbacks (evt_sm90.py).

``D = post(residual_op(act(acc + bias), C))``, each op rounded to the output type,
staged in shared memory in column chunks and stored in 16-byte row chunks. Its
instantiation costs about half the nvcc time of the TMA epilogue's (session 37,
2-core machine, ``benchmarks/results/staged_epilogue_build_2core_2026-12-05_s37.txt``:
a unit of four GEMM kernels 25 s against 48 s, of two TMA convs 16 s against 29 s;
``compile mlp --arch sm_90a`` cold 17.8 s against 36.3 s).

Two forms, by how the staged output is written (``form()``):

* ``"rows"`` (templates/staged_epilogue.h): 16-byte row chunks from every thread.
  Its session-38 version was correct on the GPU (tests/gpu/test_staged_epilogue_gpu.py,
  H100) but slower than the TMA epilogue (benchmarks/staged_epilogue.py on the H100:
  geomean 0.87x, worst 0.61x, ``benchmarks/results/staged_epilogue_2026-12-05_h100_s38.*``);
  the current one (stmatrix staging, full tiles without bound checks) has not run.
* ``"tma"`` (templates/staged_tma_epilogue.h, session 39): swizzled 64-row boxes
  stored by TMA from one thread per warp group, as CUTLASS's TMA epilogue writes; the
  same build time (``compile mlp`` cold 18 s against 36 s; whisper-encoder's and
  llama's cold builds with the FMHA's staged O store too 0.62-0.63x,
  ``benchmarks/results/cold_build_staged_forms_2core_2026-12-05_s39.txt``), static SASS
  within 6-10% of the TMA epilogue's, its stage counts. On an H100 (session 41,
  ``benchmarks/results/staged_tma_epilogue_2026-12-06_h100_s41.*``) its 12 benchmark
  GEMMs were correct but at 0.826x the TMA epilogue's speed (geomean; worst 0.59x).

Off by default: the build time saved is not worth kernels slower than the ones they
replace, and both forms measured slower. ``$CUTLASS_OFFLOAD_STAGED_EPILOGUE``
(config.py: 1 / tma or rows) switches it on for every kernel ``applies`` accepts:
gemm_sm90.py's GEMMs (and the GEMMs of convs lowered onto them, conv_gemm_sm90.py) and
conv_sm90.py's implicit-GEMM convs; ``ENABLED`` True / False (with ``STORE``) overrides
the environment (benchmarks, tests).
"""
from __future__ import annotations

import string
from pathlib import Path

from .. import config
from ..ir import GemmEpilogue
from . import activations

# None: follow $CUTLASS_OFFLOAD_STAGED_EPILOGUE (config.staged_epilogue); True: on in
# STORE's form; False: off whatever the environment says (benchmarks' baselines, tests)
ENABLED: bool | None = None
# The staged chunk's widest (8-column groups) and the chunks staged at once (1 or 2):
# template arguments, so benchmarks/staged_epilogue.py can build and time other values
MAX_CHUNK_GROUPS = 12
BUFFERS = 1
# "rows" or "tma"; the TMA form's widest chunk (64, 32 or 16 columns) and its 64-row
# boxes in flight per warp group
STORE = "tma"
TMA_MAX_CHUNK_COLS = 32     # CUTLASS's own epilogue subtiles are 32 wide
TMA_BUFFERS = 2

_TEMPLATES = Path(__file__).parent / "templates"
# what the GLU epilogue (glu_sm90.H) and the staged one share; spliced before either
COMMON_H = (_TEMPLATES / "staged_common.h").read_text()
STAGED_H = (_TEMPLATES / "staged_epilogue.h").read_text()
TMA_STAGED_H = (_TEMPLATES / "staged_tma_epilogue.h").read_text()
# guarded: a unit's kernels share one copy (the TMA form needs the unit's tma_driver.h,
# sm90_parts.TMA_DRIVER, which every sm90 unit's preamble carries)
HEADERS = COMMON_H + STAGED_H + TMA_STAGED_H
INCLUDES = ("cutlass/epilogue/collective/detail.hpp", "cutlass/epilogue/thread/linear_combination.h",
            "cutlass/numeric_conversion.h", "cutlass/arch/memory_sm80.h", "cute/arch/copy_sm90.hpp",
            "cute/arch/copy_sm90_tma.hpp", "cutlass/arch/barrier.h")

# GEMM: C and D row-major (M, N, L); conv: NPQK seen as ((q, p, n), k, batch), packed
GEMM_STRIDE = "cute::Stride<int64_t, cute::_1, int64_t>"
CONV_STRIDE = "cute::Stride<cute::Stride<int64_t, int64_t, int64_t>, cute::_1, cute::_0>"

# Replaces an emitter's sm90_parts.EPILOGUE (the cluster shape, fusion and builder)
EPILOGUE = string.Template("""\
using ClusterShape = cute::Shape<cute::_${cluster_m}, cute::_${cluster_n}, cute::_${cluster_k}>;

// Epilogue: ${epilogue_tag}, staged in shared memory, ${staged_store}
// (the mainloop's stages are counted after its shared memory)
using CollectiveEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
    co_staged::${staged_class}<ElementC, ElementD, ElementBias, ${staged_activation}, ${staged_has_activation},
                              ${staged_bias}, ${staged_residual}, ${staged_post}, ${staged_has_post},
                              cutlass::epilogue::NoSmemWarpSpecialized, TileShape,
                              ${staged_stride}, ${staged_knobs}>>;

""")

# no activation / post op: the functor the templates take
IDENTITY = "cutlass::epilogue::thread::Identity"
_RESIDUAL = {"none": "0", "add": "1", "mul": "2"}


def applies(dtype: str, ep: GemmEpilogue, transposed: bool = False, n_split: bool = False) -> bool:
    """Whether a kernel takes the staged epilogue (only while ``form()`` is one): 16-bit
    output, an elementwise epilogue with a full-shape residual if any (no GLU, no
    per-channel or per-sample residual), D not transposed (swap AB) and the tile's
    columns in one warp group's wgmma (no N-split)."""
    return (dtype in ("f16", "bf16") and not ep.glu and not ep.residual_broadcast
            and not transposed and not n_split and form() is not None)


def form() -> str | None:
    """The staged epilogue's form for the kernels ``applies`` takes: "rows", "tma", or
    None (CUTLASS's TMA epilogue stays): ``STORE`` where ``ENABLED`` is True, None where
    it is False (benchmarks, tests), else ``$CUTLASS_OFFLOAD_STAGED_EPILOGUE`` (read
    now; ValueError for a value it does not take)."""
    if ENABLED is not None:
        return STORE if ENABLED else None
    return config.staged_epilogue()


def tma_store(tile_n: int) -> bool:
    """Whether a kernel of tile N ``tile_n`` stores through TMA: the "tma" form and
    ``tile_n`` a multiple of 16 (the TMA form's chunks are 16, 32 or 64 columns)."""
    return form() == "tma" and tile_n % 16 == 0


def tma_knobs(groups: int) -> str:
    """The TMA form's last template arguments: its widest chunk, its boxes in flight and
    the consumer warp groups in their epilogue at once (``groups``)."""
    return f"{TMA_MAX_CHUNK_COLS}, {TMA_BUFFERS}, {groups}"


def values(ep: GemmEpilogue, stride: str, tile_n: int, groups: int = 1) -> dict:
    """The ``${staged_*}`` placeholders of ``EPILOGUE`` for ``ep``; ``stride`` is the
    C / D stride type (GEMM_STRIDE or CONV_STRIDE), ``tile_n`` the CTA tile's N,
    ``groups`` the consumer warp groups in their epilogue at once (2 in a cooperative
    kernel, else 1: the TMA form's shared-memory regions)."""
    act, post = activations.FUNCTOR[ep.activation], activations.FUNCTOR[ep.post_activation]
    tma = tma_store(tile_n)
    return {
        "staged_class": "TmaStagedEpilogue" if tma else "StagedEpilogue",
        "staged_store": ("stored by TMA (templates/staged_tma_epilogue.h)" if tma
                         else "stored in 16-byte row chunks (templates/staged_epilogue.h)"),
        # the widest chunk, the chunks (row form) or boxes (TMA form) in flight[, groups]
        "staged_knobs": tma_knobs(groups) if tma else f"{MAX_CHUNK_GROUPS}, {BUFFERS}",
        "staged_activation": act or IDENTITY,
        "staged_has_activation": "true" if act else "false",
        "staged_bias": "true" if ep.bias else "false",
        "staged_residual": _RESIDUAL[ep.residual],
        "staged_post": post or IDENTITY,
        "staged_has_post": "true" if post else "false",
        "staged_stride": stride,
    }


def fusion_args(ep: GemmEpilogue) -> str:
    """The epilogue's arguments after ``{{}, ptr_C, dC, ptr_D, dD}``: its bias pointer."""
    return ("  arguments.epilogue.thread.bias = " +
            ("static_cast<ElementBias const*>(args.bias);" if ep.bias else "nullptr;"))
