"""GEMM regions: the problem, the launch arguments, the kernel and the region.

* ``GemmEpilogue`` / ``GemmProblem``: a region's GEMM and its fused epilogue,
  with the shapes known at compile time (M may be dynamic). (``GemmEpilogue``
  lives in ir/common.py: conv and norm problems use it too.)
* ``GemmKernel``: one distinct kernel instantiation = problem class (dtypes,
  layouts, alignments, epilogue) + config + target arch. Its ``name`` is its
  identity for dedup, logs and C++ symbols. Problem sizes are runtime arguments.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .common import ARCHS, DTYPES, LAYOUTS, GemmEpilogue, KernelConfig, _check, _Region


@dataclass(frozen=True)
class GemmProblem:
    """What one GEMM region computes: D(L, M, N) = epilogue(A(L, M, K) @ B(L, K, N)).

    m: rows (the product of the leading dims), ``None`` when dynamic; m_hint is the
    value seen in the example inputs, used only for tile selection.
    batch: L, ``None`` when dynamic; 1 when the batch was folded into M.
    layout_a "row": A (L, M, K) with K contiguous; "col": M contiguous (a transposed
    view, e.g. ``x.transpose(1, 2)`` fed to a Linear), each batch entry column-major.
    layout_b "col" means B is stored (N, K) with K contiguous (a Linear weight),
    "row" means (K, N).
    align_*: elements, the largest of 8/4/2/1 (for 16-bit types) that divides the
    contiguous extent and leading dimension; checked again on every call.
    a_batch_broadcast: A has no batch dims and is shared by every batch entry of B
    (batch stride 0). A B without batch dims is folded into M instead.
    """

    n: int
    k: int
    dtype: str
    layout_b: str
    align_a: int
    align_b: int
    align_c: int
    epilogue: GemmEpilogue = GemmEpilogue()
    m: Optional[int] = None
    m_hint: int = 128
    batch: Optional[int] = 1
    batch_hint: int = 1
    a_batch_broadcast: bool = False
    tf32: bool = False
    layout_a: str = "row"

    def __post_init__(self):
        _check(self.dtype, DTYPES, "dtype")
        _check(self.layout_a, LAYOUTS, "layout_a")
        if self.layout_a == "col" and self.tf32:
            raise ValueError("TF32 needs A with K contiguous (layout_a 'row'): wgmma reads "
                             "32-bit operands K-major only")
        _check(self.layout_b, LAYOUTS, "layout_b")
        for a in (self.align_a, self.align_b, self.align_c):
            _check(a, (1, 2, 4, 8), "alignment")
        if self.n < 1 or self.k < 1:
            raise ValueError(f"N and K must be positive, got N={self.n} K={self.k}")
        if self.dtype == "f32" and not self.tf32:
            raise ValueError("fp32 GEMMs run only as TF32, which must be opted in")

    @property
    def rows(self) -> int:
        """The rows the tiles cover at the example size: M (or m_hint) times the batch
        (or batch_hint) for a batched GEMM, every batch entry tiled on its own."""
        m = self.m if self.m is not None else self.m_hint
        batch = self.batch if self.batch is not None else self.batch_hint
        return m * max(1, batch)

    def summary(self) -> dict:
        """The problem as the report shows it (JSON-able); A's layout only when it is
        not the usual row-major one."""
        out = {"n": self.n, "k": self.k, "m_hint": self.m_hint}
        if self.layout_a != "row":
            out["layout_a"] = self.layout_a
        return out


RASTER_ORDERS = ("heuristic", "along_m", "along_n")
DECOMPOSITIONS = ("heuristic", "data_parallel", "split_k", "stream_k")


@dataclass(frozen=True)
class GemmLaunch:
    """Run-time arguments of a CUTLASS 3.x GEMM launch: how the tile scheduler walks
    the output tiles and how the grid is launched. None of them changes the compiled
    kernel, so a tuner tries them without compiling anything
    (cutlass/gemm/kernel/tile_scheduler_params.h, sm90_tile_scheduler_stream_k.hpp).

    raster: the order CTAs visit output tiles: "heuristic" (CUTLASS: along the longer
      of M / N), "along_m" or "along_n".
    swizzle: max_swizzle_size, 1, 2, 4 or 8: tiles handed out in groups of this many
      rows (columns) for L2 reuse.
    splits: K split into this many parts (stream-K scheduler kernels only; 1 = none).
    decomposition: "heuristic" (CUTLASS picks data-parallel, split-K or stream-K),
      "data_parallel", "split_k" (with ``splits``) or "stream_k" (stream-K scheduler
      kernels only; persistent-scheduler kernels need "heuristic").
    pdl: launch with programmatic dependent launch (CUDA's
      cudaLaunchAttributeProgrammaticStreamSerialization): the kernel may start while
      the previous kernel on the stream finishes and waits (griddepcontrol.wait)
      before it reads global memory, hiding launch latency and prologue.
    Default: CUTLASS's defaults, no PDL.
    """

    raster: str = "heuristic"
    swizzle: int = 1
    splits: int = 1
    decomposition: str = "heuristic"
    pdl: bool = False

    def __post_init__(self):
        _check(self.raster, RASTER_ORDERS, "raster")
        _check(self.swizzle, (1, 2, 4, 8), "swizzle")
        _check(self.decomposition, DECOMPOSITIONS, "decomposition")
        if not isinstance(self.splits, int) or not 1 <= self.splits <= 64:
            raise ValueError(f"splits must be an int in [1, 64], got {self.splits!r}")
        if self.splits > 1 and self.decomposition != "split_k":
            raise ValueError("splits > 1 needs decomposition 'split_k'")

    @property
    def tag(self) -> str:
        """Short label of the non-default knobs ("default" when none)."""
        parts = []
        if self.raster != "heuristic":
            parts.append(self.raster)
        if self.swizzle != 1:
            parts.append(f"swz{self.swizzle}")
        if self.decomposition != "heuristic":
            parts.append({"data_parallel": "dp", "split_k": f"splitk{self.splits}",
                          "stream_k": "sk"}[self.decomposition])
        if self.pdl:
            parts.append("pdl")
        return "_".join(parts) or "default"


@dataclass(frozen=True)
class GemmKernel:
    """One distinct kernel instantiation: shared by every region that maps onto it.

    launch: the run-time arguments the regions using it launch it with (GemmLaunch;
    3.x kernels only). Not part of the compiled identity: ``name`` leaves it out,
    so regions launching one kernel differently still share its code.
    """

    arch: str
    dtype: str
    layout_b: str
    align_a: int
    align_b: int
    align_c: int
    epilogue: GemmEpilogue
    config: KernelConfig
    layout_a: str = "row"
    accumulate: str = "f32"
    launch: GemmLaunch = GemmLaunch()

    def __post_init__(self):
        _check(self.arch, ARCHS, "arch")
        _check(self.dtype, DTYPES, "dtype")
        if self.config.family == "cutlass3x_sm90" and self.arch != "sm90a":
            raise ValueError("CUTLASS 3.x sm90 kernels need the sm90a target")
        if self.epilogue.glu and self.config.family != "cutlass3x_sm90":
            raise ValueError("a GLU epilogue runs on the CUTLASS 3.x sm90 GEMM kernels only")
        if self.launch != GemmLaunch() and self.config.family != "cutlass3x_sm90":
            raise ValueError("launch arguments are for CUTLASS 3.x kernels only")
        if self.launch.decomposition != "heuristic" and self.config.tile_scheduler != "stream_k":
            raise ValueError(f"decomposition {self.launch.decomposition!r} needs the stream-K "
                             "tile scheduler")
        if self.launch.pdl and self.config.tile_scheduler == "stream_k":
            # CUTLASS 4.2's stream-K scheduler does not compile with grid dependency
            # control (sm90_tile_scheduler_stream_k.hpp is_last_tile), so its kernels
            # are built without it and cannot wait for a PDL predecessor
            raise ValueError("PDL needs a persistent-scheduler kernel (stream-K kernels are "
                             "built without grid dependency control)")

    kind = "gemm"
    args_type = "CoGemmArgs"

    @property
    def name(self) -> str:
        fam = "cutlass3x_sm90" if self.config.family == "cutlass3x_sm90" else "cutlass2x_sm80"
        lay = ("t" if self.layout_a == "row" else "n") + ("n" if self.layout_b == "col" else "t")
        return (f"{fam}_gemm_{self.dtype}_{lay}_{self.config.tag}"
                f"_align{self.align_a}{self.align_b}{self.align_c}_{self.epilogue.tag}")


BATCH_MODES = ("fold", "batched", "a_broadcast", "b_broadcast", "expand")


@dataclass(frozen=True)
class GemmRegion(_Region):
    """A GEMM-family subgraph to offload: anchor op + fused epilogue.

    nodes: FX node names, in graph order; the last one is the region's output.
    a, b, bias, c: names of the region's input nodes by role (bias and c may be None).
    form: the anchor op ("linear", "matmul", "mm", "addmm", "bmm").
    b_nk: B is given as stored (N, K) (a Linear weight): logical B = b^T.
    batch_mode: "fold" (batch dims folded into M, L = 1), "batched" (A and B
      have the same batch dims), "a_broadcast" (A is shared by every batch),
      "b_broadcast" (B is shared by every batch: a Linear on a column-major A, whose
      leading dims cannot fold into M) or "expand" (the batch dims broadcast
      partially, e.g. (3, 1) x (3, 2): each operand is expanded to the broadcast
      batch, copying the one that repeats).
    """

    name: str
    form: str
    nodes: tuple
    a: str
    b: str
    problem: GemmProblem
    bias: Optional[str] = None
    c: Optional[str] = None
    b_nk: bool = False
    batch_mode: str = "fold"
    notes: tuple = ()

    def __post_init__(self):
        _check(self.batch_mode, BATCH_MODES, "batch_mode")
