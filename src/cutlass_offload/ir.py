"""Plain data objects passed between pipeline stages.

The problem (what must be computed) is kept apart from the choice (how a kernel
computes it):

* ``GemmEpilogue`` / ``GemmProblem``: a region's GEMM and its fused epilogue,
  with the shapes known at compile time (M may be dynamic).
* ``KernelConfig``: tile shape, warp shape, stages, cluster, schedule.
* ``GemmKernel``: one distinct kernel instantiation = problem class (dtypes,
  layouts, alignments, epilogue) + config + target arch. Its ``name`` is its
  identity for dedup, logs and C++ symbols. Problem sizes are runtime arguments.

All classes are frozen dataclasses of scalars and tuples; they validate in
``__post_init__`` and raise ``ValueError`` on an impossible combination.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

DTYPES = ("f16", "bf16", "f32")
ACTIVATIONS = ("identity", "relu", "gelu_erf", "gelu_tanh", "silu", "sigmoid")
RESIDUAL_OPS = ("none", "add", "mul")
POST_ACTIVATIONS = ("identity", "relu")
LAYOUTS = ("row", "col")
ARCHS = ("sm80", "sm90a")
FAMILIES = ("cutlass2x_sm80", "cutlass3x_sm90")

_SHORT = {
    "identity": "id", "relu": "relu", "gelu_erf": "gelu", "gelu_tanh": "gelutanh",
    "silu": "silu", "sigmoid": "sigmoid", "add": "add", "mul": "mul",
}


def _check(value, allowed, what):
    if value not in allowed:
        raise ValueError(f"{what} must be one of {allowed}, got {value!r}")


@dataclass(frozen=True)
class GemmEpilogue:
    """D = post(residual_op(activation(acc + bias), C)), computed in fp32.

    bias: a per-output-column vector of shape (N,), broadcast over rows and batch.
    residual: "add" or "mul" with a full-shape source C of shape (L, M, N).
    post_activation: only "relu" after a residual (ResNet/TVM residual block form).
    """

    bias: bool = False
    activation: str = "identity"
    residual: str = "none"
    post_activation: str = "identity"

    def __post_init__(self):
        _check(self.activation, ACTIVATIONS, "activation")
        _check(self.residual, RESIDUAL_OPS, "residual")
        _check(self.post_activation, POST_ACTIVATIONS, "post_activation")
        if self.post_activation != "identity" and self.residual == "none":
            raise ValueError("post_activation needs a residual; fold it into activation")

    @property
    def tag(self) -> str:
        parts = ["bias"] if self.bias else []
        if self.activation != "identity":
            parts.append(_SHORT[self.activation])
        if self.residual != "none":
            parts.append("res" + _SHORT[self.residual])
        if self.post_activation != "identity":
            parts.append(_SHORT[self.post_activation])
        return "_".join(parts) or "plain"


@dataclass(frozen=True)
class GemmProblem:
    """What one GEMM region computes: D(L, M, N) = epilogue(A(L, M, K) @ B(L, K, N)).

    m: rows (the product of the leading dims), ``None`` when dynamic; m_hint is the
    value seen in the example inputs, used only for tile selection.
    batch: L, ``None`` when dynamic; 1 when the batch was folded into M.
    layout_a is always "row" (K contiguous). layout_b "col" means B is stored
    (N, K) with K contiguous (a Linear weight), "row" means (K, N).
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
        _check(self.layout_a, ("row",), "layout_a")
        _check(self.layout_b, LAYOUTS, "layout_b")
        for a in (self.align_a, self.align_b, self.align_c):
            _check(a, (1, 2, 4, 8), "alignment")
        if self.n < 1 or self.k < 1:
            raise ValueError(f"N and K must be positive, got N={self.n} K={self.k}")
        if self.dtype == "f32" and not self.tf32:
            raise ValueError("fp32 GEMMs run only as TF32, which must be opted in")


@dataclass(frozen=True)
class KernelConfig:
    """How a kernel computes: the tuning choice.

    tile: threadblock (CTA) tile (M, N, K) in elements.
    warp: warp tile (M, N, K) for CUTLASS 2.x; unused (0, 0, 0) for 3.x.
    instruction: MMA instruction shape for 2.x, e.g. (16, 8, 16).
    stages: software pipeline depth; 0 = let the 3.x collective builder choose.
    cluster: thread block cluster shape (3.x only), (1, 1, 1) for 2.x.
    kernel_schedule / epilogue_schedule: 3.x schedule tags (C++ type names
    without namespace), e.g. "KernelTmaWarpSpecializedCooperative".
    """

    family: str
    tile: tuple
    stages: int
    warp: tuple = (0, 0, 0)
    instruction: tuple = (0, 0, 0)
    cluster: tuple = (1, 1, 1)
    kernel_schedule: str = ""
    epilogue_schedule: str = ""

    def __post_init__(self):
        _check(self.family, FAMILIES, "family")
        if len(self.tile) != 3 or len(self.cluster) != 3:
            raise ValueError("tile and cluster are (M, N, K) triples")
        if self.family == "cutlass2x_sm80" and (len(self.warp) != 3 or 0 in self.warp):
            raise ValueError("a CUTLASS 2.x config needs a warp shape")

    @property
    def tag(self) -> str:
        t = "x".join(map(str, self.tile))
        if self.family == "cutlass3x_sm90":
            c = "x".join(map(str, self.cluster))
            sched = {"KernelTmaWarpSpecializedCooperative": "coop",
                     "KernelTmaWarpSpecializedPingpong": "pingpong",
                     "KernelTmaWarpSpecialized": "ws"}.get(self.kernel_schedule, "auto")
            return f"{t}_c{c}_{sched}" + (f"_s{self.stages}" if self.stages else "")
        w = "x".join(map(str, self.warp))
        return f"{t}_w{w}_s{self.stages}"


@dataclass(frozen=True)
class GemmKernel:
    """One distinct kernel instantiation: shared by every region that maps onto it."""

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

    def __post_init__(self):
        _check(self.arch, ARCHS, "arch")
        _check(self.dtype, DTYPES, "dtype")
        if self.config.family == "cutlass3x_sm90" and self.arch != "sm90a":
            raise ValueError("CUTLASS 3.x sm90 kernels need the sm90a target")

    @property
    def name(self) -> str:
        fam = "cutlass3x_sm90" if self.config.family == "cutlass3x_sm90" else "cutlass2x_sm80"
        lay = ("t" if self.layout_a == "row" else "n") + ("n" if self.layout_b == "col" else "t")
        return (f"{fam}_gemm_{self.dtype}_{lay}_{self.config.tag}"
                f"_align{self.align_a}{self.align_b}{self.align_c}_{self.epilogue.tag}")


@dataclass(frozen=True)
class KernelSource:
    """C++ for one kernel: its includes (collected once per TU) and its code.

    code defines ``namespace <name> { int64_t workspace_size(const CoGemmArgs&);
    int run(const CoGemmArgs&, cudaStream_t); }``.
    """

    name: str
    includes: tuple
    code: str


def replace(obj, **changes):
    return dataclasses.replace(obj, **changes)


@dataclass(frozen=True)
class GemmRegion:
    """A GEMM-family subgraph to offload: anchor op + fused epilogue.

    nodes: FX node names, in graph order; the last one is the region's output.
    a, b, bias, c: names of the region's input nodes by role (bias and c may be None).
    form: the anchor op ("linear", "matmul", "mm", "addmm", "bmm").
    b_nk: B is given as stored (N, K) (a Linear weight): logical B = b^T.
    batch_mode: "fold" (batch dims folded into M, L = 1), "batched" (A and B
      have the same batch dims) or "a_broadcast" (A is shared by every batch).
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
        _check(self.batch_mode, ("fold", "batched", "a_broadcast"), "batch_mode")

    @property
    def output(self) -> str:
        return self.nodes[-1]


@dataclass(frozen=True)
class Fallback:
    """An op that stays in PyTorch, and why (reaches the user's report)."""

    node: str
    op: str
    reason: str


@dataclass(frozen=True)
class PartitionResult:
    regions: tuple
    fallbacks: tuple


@dataclass(frozen=True)
class Plan:
    """Regions with their chosen kernel instantiation; kernels are deduplicated."""

    arch: str
    regions: tuple           # GemmRegion
    kernels: tuple           # GemmKernel, parallel to regions
    fallbacks: tuple

    @property
    def distinct_kernels(self) -> tuple:
        seen = {}
        for k in self.kernels:
            seen.setdefault(k.name, k)
        return tuple(seen.values())
