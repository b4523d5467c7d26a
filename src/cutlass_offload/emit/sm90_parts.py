"""The C++ that every CUTLASS 3.x sm90 GEMM-family emitter writes the same way
(gemm_sm90.py, conv_sm90.py), written once: template text spliced into their
``string.Template`` sources (so the emitted code is what each wrote before), and
the plain-vs-EVT fusion and stage-count values they substitute.

* ``ALIGNMENTS``: the alignment constants and the rounding style.
* ``EPILOGUE``: the cluster shape, the fusion operation and the epilogue
  collective builder (``${cluster_*}``, ``${epilogue_tag}``, ``${fusion_type}``,
  ``${epilogue_schedule}``, ``${epilogue_tile}`` placeholders).
* ``TMA_DRIVER``: templates/tma_driver.h, the preamble of every TMA unit (the
  driver entry point of the descriptor encodes looked up once, not per encode).
* ``launcher(...)``, ``CACHE_HIT``, ``run_tail(...)``: the launch path. ``run``
  starts with ``CACHE_HIT`` (a call with the arguments of an earlier one launches
  its stored Params: no checks, no TMA descriptor encodes) and ends with
  ``run_tail``: what the device adapter's ``initialize`` + ``run`` do, with the
  shared-memory opt-in done once per device (prelude.h ``co_opt_in_smem``) instead
  of on every call.
"""
from __future__ import annotations

from pathlib import Path

from ..ir import GemmEpilogue
from .evt_sm90 import evt, is_plain

TMA_DRIVER = (Path(__file__).parent / "templates" / "tma_driver.h").read_text()

ALIGNMENTS = """\
constexpr int AlignmentA = ${align_a};
constexpr int AlignmentB = ${align_b};
constexpr int AlignmentC = ${align_c};
constexpr int AlignmentD = ${align_c};
constexpr auto RoundStyle = cutlass::FloatRoundStyle::round_to_nearest;

"""

# The cluster shape and the fusion operation (``${cluster_*}``, ``${epilogue_tag}``,
# ``${fusion_type}``), then the TMA epilogue the collective builder makes of them;
# an emitter that builds its epilogue otherwise replaces EPILOGUE_BUILDER only.
EPILOGUE_FUSION = """\
using ClusterShape = cute::Shape<cute::_${cluster_m}, cute::_${cluster_n}, cute::_${cluster_k}>;

// Epilogue fusion: ${epilogue_tag}
using FusionOp =
${fusion_type};

"""
EPILOGUE_BUILDER = """\
using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    TileShape, ClusterShape,
    ${epilogue_tile},
    ElementAccumulator, ElementCompute,
    ElementC, LayoutC, AlignmentC,
    ElementD, LayoutD, AlignmentD,
    cutlass::epilogue::${epilogue_schedule},
    FusionOp
  >::CollectiveOp;

"""
EPILOGUE = EPILOGUE_FUSION + EPILOGUE_BUILDER

# A conv's CoConvArgs extents: each fits an int (co_fits_int), the sizes positive
CONV_EXTENTS_OK = """\
  const int64_t ext[] = {a.n, a.h, a.w, a.c, a.k, a.r, a.s, a.p, a.q, a.pad_h, a.pad_w,
                         a.stride_h, a.stride_w, a.dilation_h, a.dilation_w};
  for (int64_t v : ext) {
    if (!co_fits_int(v)) return false;
  }
  if (a.h < 1 || a.w < 1 || a.c < 1 || a.k < 1 || a.r < 1 || a.s < 1 || a.p < 1 || a.q < 1) {
    return false;
  }
"""

# Defined before ``run``: the launcher's Params cache (prelude.h CoParamsCache) and
# ``co_launch``, the launch of given Params: the shared memory opt-in once per device
# (prelude.h ``co_opt_in_smem``; CUTLASS's initialize does it on every call), then
# the adapter's run.
_LAUNCHER = """\
static CoParamsCache<@ARGS@, typename @KERNEL@::Params> co_params_cache;

static int co_launch(typename @KERNEL@::Params& params, const @ARGS@& args, cudaStream_t stream) {
  static std::atomic<int> smem_ready[kCoMaxDevices];
  int ready = co_opt_in_smem(cutlass::device_kernel<@KERNEL@>,
                             static_cast<int>(@KERNEL@::SharedStorageSize), smem_ready, 9);
  if (ready != CO_OK) {
    return ready;
  }
@LAUNCH@    return CO_LAUNCH_FAILED;
  }
  if (cudaGetLastError() != cudaSuccess) {
    return CO_LAUNCH_FAILED;
  }
  return CO_OK;
}

"""

# The first statement of ``run``: a call whose arguments were launched before reuses
# their Params (every check passed then, and Params depend on the arguments alone)
CACHE_HIT = """\
  if (auto cached = co_params_cache.find(args)) {
    return co_launch(*cached, args, stream);
  }
"""

_RUN_TAIL = """\
  int64_t needed = static_cast<int64_t>(@ADAPTER@::get_workspace_size(arguments));
  if (args.workspace_bytes < needed || (needed > 0 && args.workspace == nullptr)) {
    return CO_WORKSPACE_TOO_SMALL;
  }
  // What @ADAPTER@::initialize + run do (the opt-in in co_launch)
  if (@KERNEL@::initialize_workspace(arguments, args.workspace, stream) != cutlass::Status::kSuccess) {
    return CO_INIT_FAILED;
  }
  typename @KERNEL@::Params params = @KERNEL@::to_underlying_arguments(arguments, args.workspace);
  if (needed == 0) {
    co_params_cache.put(args, params);   // a workspace is initialized per call: never cached
  }
  return co_launch(params, args, stream);
}

}  // namespace ${name}
"""


def launcher(kernel: str, args: str, launch: str) -> str:
    """Template text of the Params cache and ``co_launch`` (before ``run``) for the
    kernel type ``kernel`` (e.g. "GemmKernel") and the argument struct ``args``
    (e.g. "CoGemmArgs"); ``launch``: the line(s) from the ``if (`` of the adapter's
    run call up to its opening brace, newline included, reading ``params`` and
    ``args``."""
    return (_LAUNCHER.replace("@KERNEL@", kernel).replace("@ARGS@", args)
            .replace("@LAUNCH@", launch))


def run_tail(adapter: str, kernel: str) -> str:
    """Template text of ``run``'s end for the device adapter type ``adapter`` (e.g.
    "Gemm") over the kernel type ``kernel`` (e.g. "GemmKernel"): the workspace
    check, its initialization, the Params (stored in the cache when no workspace
    needs initializing) and ``co_launch`` (``launcher(...)``). Expects ``arguments``
    (the adapter's Arguments) in scope and closes ``run`` and the kernel's
    namespace."""
    return _RUN_TAIL.replace("@ADAPTER@", adapter).replace("@KERNEL@", kernel)


def fusion(ep: GemmEpilogue, residual_source=None, transposed: bool = False) -> tuple:
    """(fusion_type, fusion_args) template values: ``LinearCombination`` with beta 0
    and no source load for a plain epilogue, else the EVT of evt_sm90.py
    (``residual_source``: the residual's node, default the source C; ``transposed``:
    a kernel computing D^T, its bias along D^T's rows)."""
    if is_plain(ep):
        return ("  cutlass::epilogue::fusion::LinearCombination<"
                "ElementD, ElementCompute, ElementC, ElementCompute, RoundStyle>",
                "  arguments.epilogue.thread.alpha = ElementCompute(1);\n"
                "  arguments.epilogue.thread.beta = ElementCompute(0);")
    tree = evt(ep, residual_source, transposed)
    return (tree.render_type(1),
            "  // EVT arguments: each node is {child args..., op args}\n"
            "  arguments.epilogue.thread =\n" + tree.render_args(2) + ";")


def stage_count(stages: int, family: str) -> str:
    """The mainloop builder's stage count: CUTLASS's automatic choice after the
    epilogue's shared memory is carved out (``stages`` 0), else exactly ``stages``;
    ``family``: "gemm" or "conv" (the collective namespace)."""
    if stages == 0:
        return (f"cutlass::{family}::collective::StageCountAutoCarveout<"
                "static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>")
    return f"cutlass::{family}::collective::StageCount<{stages}>"


def check_stages(stages: int) -> None:
    """Raise ValueError unless ``stages`` is 0 (the builder's choice) or >= 2."""
    if stages < 0 or stages == 1:
        raise ValueError(f"stages must be 0 (auto) or >= 2, got {stages}")


_COOP = "KernelTmaWarpSpecializedCooperative"
_PINGPONG = "KernelTmaWarpSpecializedPingpong"
EPILOGUE_TILE_AUTO = "cutlass::epilogue::collective::EpilogueTileAuto"


def consumer_groups(config) -> int:
    """The consumer warp groups of a GEMM-family ``config``'s kernel that run their
    epilogue at the same time: 2 in the cooperative kernel; 1 in the ping-pong kernel
    (its groups take turns) and the basic warp-specialized one (one consumer group)."""
    return 2 if config.kernel_schedule == _COOP else 1


def epilogue_tile(config) -> str:
    """The epilogue tile (``${epilogue_tile}``) of a GEMM-family ``config``: C++ text.

    CUTLASS's automatic one (``EpilogueTileAuto``; sm90_builder.inl
    ``sm90_compute_tile_shape_or_override``) stores a cooperative tile in 128 x
    gcd(32, tile N) subtiles and a ping-pong tile in 64 x gcd(32, tile N): 16
    columns for a tile N that is an odd multiple of 16 (176, 208, 240), 11 to 15
    subtiles, each with its barrier and TMA store, where a 128-wide tile takes 4.
    Such tiles get one subtile as wide as the tile: (128, N) cooperative, (64, N)
    ping-pong, the only row counts the builder accepts for an explicit tile (and
    N % 16 == 0). Every other config keeps the automatic tile, so its source (and
    cache key) is unchanged. Not measured apart from ``wgmma_selector`` (both came in
    together): with both, 128x176 ran llama's plain 2048x5632x2048 in 68.8 us on
    the H200, but with a fused SiLU-multiply reading C in 100.6 us, where 128x128
    ping-pong took 82.3 (the tile-wide C stages leave the mainloop fewer stages;
    not profiled), so the learned table keeps that epilogue's own winner
    (select/sm90.py Table).
    """
    _, tn, _ = config.tile
    rows = {_COOP: 128, _PINGPONG: 64}.get(config.kernel_schedule)
    if tn % 32 == 0 or rows is None:
        return EPILOGUE_TILE_AUTO
    return f"cute::Shape<cute::_{rows}, cute::_{tn}>"


# The wgmma N extents CuTe's atom selector offers by default (cute/arch/mma_sm90.hpp
# ss_op_selector); the other multiples of 8 up to 256 are in its extended headers.
BASE_WGMMA_N = (8, 16, 32, 64, 96, 128, 192, 256)
WGMMA_EXT_INCLUDES = ("cute/arch/mma_sm90_gmma_ext.hpp", "cute/atom/mma_traits_sm90_gmma_ext.hpp")
WGMMA_TYPES = {"f16": ("cutlass::half_t", "F32F16F16"), "bf16": ("cutlass::bfloat16_t", "F32BF16BF16")}


def wgmma_n(config) -> int:
    """The N of ``config``'s wgmma: the tile's N, or half of it for an N-split config
    (each consumer warp group takes half of the columns)."""
    return config.tile[1] // 2 if config.n_split else config.tile[1]


def wide_mma(config) -> bool:
    """Whether ``config``'s wgmma N is outside CuTe's default shapes (BASE_WGMMA_N)."""
    return wgmma_n(config) not in BASE_WGMMA_N


def wgmma_selector(kernel) -> str:
    """C++ that makes CUTLASS's collective builder run ``kernel`` (a sm90 GemmKernel) on
    a wgmma as wide as its tile: "" unless ``wide_mma``, else an explicit
    specialization of CuTe's ``ss_op_selector`` for its element type, tile shape and
    operand majors returning the 64 x N x 16 atom (guarded, so kernels of one unit may
    share it). Goes before any namespace of the unit, after WGMMA_EXT_INCLUDES.

    Without it the selector takes the largest default N that divides the tile's: a
    128x176 tile runs eleven 64x16 wgmmas per K step, each reading the tile's A from
    shared memory again: 137 us on llama's 2048x5632x2048 on the H200, 68.8 us on the
    64x176 atom (kernels_fitted_2026-12-0[13]_h200.json; HGMMA.64x176x16 in the SASS).
    CuTe's own switch, CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, also pulls in the sparse
    extended headers: parsing a unit's CUTLASS headers took 64.5 s with it, 32.1 s with
    the two dense headers included here and 19.5 s with neither (nvcc -c, 2-core
    machine). Raises ValueError for a dtype without 16-bit wgmma atoms here.
    """
    cfg = kernel.config
    if not wide_mma(cfg) or cfg.n_split:   # an N-split mainloop names its atom itself
        return ""
    if kernel.dtype not in WGMMA_TYPES:
        raise ValueError(f"a tile N of {cfg.tile[1]} needs an f16 / bf16 kernel, got {kernel.dtype}")
    element, kind = WGMMA_TYPES[kernel.dtype]
    major_a = "K" if kernel.layout_a == "row" else "MN"
    major_b = "K" if kernel.layout_b == "col" else "MN"
    tm, tn, tk = cfg.tile
    guard = f"CO_WGMMA_{kernel.dtype}_{major_a}{major_b}_{tm}x{tn}x{tk}"
    return f"""\
#ifndef {guard}
#define {guard}
// tile N {tn} is not among CuTe's default wgmma shapes: this gives the builder the
// 64x{tn} atom instead of several narrower ones per K step (emit/sm90_parts.py)
namespace cute::SM90::GMMA {{
template <>
CUTE_HOST_DEVICE constexpr auto
ss_op_selector<{element}, {element}, float, cute::Shape<cute::_{tm}, cute::_{tn}, cute::_{tk}>,
               Major::{major_a}, Major::{major_b}>() {{
  return MMA_64x{tn}x16_{kind}_SS<Major::{major_a}, Major::{major_b}>{{}};
}}
}}  // namespace cute::SM90::GMMA
#endif
"""


def mma_check(config) -> str:
    """A static_assert (C++, right after ``CollectiveMainloop``'s definition) that a
    wide-MMA kernel's wgmma is as wide as its tile; "" for the others (their source
    stays as it was)."""
    if not wide_mma(config):
        return ""
    return ("\nstatic_assert(cute::size<1>(typename CollectiveMainloop::TiledMma::AtomShape_MNK{}) "
            f"== {wgmma_n(config)},\n              \"the wgmma is as wide as the tile "
            "(sm90_parts.wgmma_selector)\");")


def shape_values(kernel) -> dict:
    """The ``${align_*}``, ``${tile_*}``, ``${cluster_*}`` and ``${epilogue_tile}``
    values of ``kernel``'s alignments (elements) and config (str -> str)."""
    cfg = kernel.config
    out = {"align_a": str(kernel.align_a), "align_b": str(kernel.align_b),
           "align_c": str(kernel.align_c), "epilogue_tile": epilogue_tile(cfg)}
    for name, triple in (("tile", cfg.tile), ("cluster", cfg.cluster)):
        out.update({f"{name}_{axis}": str(v) for axis, v in zip("mnk", triple)})
    return out
