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
import numbers
from dataclasses import dataclass
from typing import Optional

DTYPES = ("f16", "bf16", "f32")
ACTIVATIONS = ("identity", "relu", "gelu_erf", "gelu_tanh", "silu", "sigmoid")
RESIDUAL_OPS = ("none", "add", "mul")
POST_ACTIVATIONS = ("identity", "relu")
LAYOUTS = ("row", "col")
ARCHS = ("sm80", "sm90a")
FAMILIES = ("cutlass2x_sm80", "cutlass3x_sm90", "rowwise_norm", "nhwc_group_norm")
TILE_SCHEDULERS = ("persistent", "stream_k")

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
    residual: "add" or "mul" with a full-shape source C of shape (L, M, N), or, with
      residual_broadcast, a vector of shape (N,) broadcast over rows (a per-channel
      tensor such as (1, K, 1, 1) after a conv), applied after the activation.
    post_activation: only "relu" after a residual (ResNet/TVM residual block form).
    """

    bias: bool = False
    activation: str = "identity"
    residual: str = "none"
    post_activation: str = "identity"
    residual_broadcast: bool = False

    def __post_init__(self):
        _check(self.activation, ACTIVATIONS, "activation")
        _check(self.residual, RESIDUAL_OPS, "residual")
        _check(self.post_activation, POST_ACTIVATIONS, "post_activation")
        if self.post_activation != "identity" and self.residual == "none":
            raise ValueError("post_activation needs a residual; fold it into activation")
        if self.residual_broadcast and self.residual == "none":
            raise ValueError("residual_broadcast needs a residual")

    @property
    def tag(self) -> str:
        parts = ["bias"] if self.bias else []
        if self.activation != "identity":
            parts.append(_SHORT[self.activation])
        if self.residual != "none":
            parts.append(("resvec" if self.residual_broadcast else "res") + _SHORT[self.residual])
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
    tile_scheduler: how output tiles map onto CTAs (3.x GEMMs only): "persistent"
    (CUTLASS's default persistent data-parallel scheduler) or "stream_k"
    (``cutlass::gemm::StreamKScheduler``, cooperative schedule only; its default
    heuristic decomposition picks data-parallel, split-K or stream-K per problem
    and needs a workspace).
    """

    family: str
    tile: tuple
    stages: int
    warp: tuple = (0, 0, 0)
    instruction: tuple = (0, 0, 0)
    cluster: tuple = (1, 1, 1)
    kernel_schedule: str = ""
    epilogue_schedule: str = ""
    tile_scheduler: str = "persistent"

    def __post_init__(self):
        _check(self.family, FAMILIES, "family")
        _check(self.tile_scheduler, TILE_SCHEDULERS, "tile_scheduler")
        if len(self.tile) != 3 or len(self.cluster) != 3:
            raise ValueError("tile and cluster are (M, N, K) triples")
        if self.tile_scheduler != "persistent" and self.family != "cutlass3x_sm90":
            raise ValueError(f"tile_scheduler {self.tile_scheduler!r} is for CUTLASS 3.x kernels only")
        if self.family == "cutlass2x_sm80" and (len(self.warp) != 3 or 0 in self.warp):
            raise ValueError("a CUTLASS 2.x config needs a warp shape")

    @property
    def tag(self) -> str:
        t = "x".join(map(str, self.tile))
        if self.family == "cutlass3x_sm90":
            c = "x".join(map(str, self.cluster))
            sched = {"KernelTmaWarpSpecializedCooperative": "coop",
                     "KernelTmaWarpSpecializedPingpong": "pingpong",
                     "KernelTmaWarpSpecialized": "ws",
                     "KernelImplicitTmaWarpSpecializedSm90": "ws"}.get(self.kernel_schedule, "auto")
            return (f"{t}_c{c}_{sched}" + (f"_s{self.stages}" if self.stages else "")
                    + ("_streamk" if self.tile_scheduler == "stream_k" else ""))
        w = "x".join(map(str, self.warp))
        return f"{t}_w{w}_s{self.stages}"


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


CONV_ITERATORS = ("optimized", "analytic", "few_channels", "fixed_channels")


@dataclass(frozen=True)
class ConvProblem:
    """What one conv2d fprop region computes, as an implicit GEMM in NHWC:

    y(N, P, Q, K) = epilogue(conv2d(x(N, H, W, C), w(K, R, S, C))), fp32 accumulation.
    The implicit GEMM has M = N * P * Q, N_gemm = K, K_gemm = R * S * C, so the
    GemmEpilogue applies with "column" = output channel: bias (K,), residual
    (N, P, Q, K) or, with residual_broadcast, a per-channel (K,) vector.

    pad: (top, bottom, left, right) in pixels; asymmetric padding is allowed (the
    kernel takes the top/left padding and P, Q; reads past the bottom/right edge
    are masked to zero).
    n: batch, ``None`` when dynamic (n_hint = the example's batch, for tile choice).
    align_a / align_b: elements, the largest of 8/4/2/1 dividing the kernel's C
    (``c_kernel``; 16-bit types); align_c: the same for K. groups: always 1
    (grouped convs stay in PyTorch).
    pad_c: zero input channels appended for the kernel (0 = none). The kernel runs
    C' = c + pad_c channels: the region module zero-pads the filter (once per
    constant weight) and copies each call's input into an NHWC buffer with C'
    channels; zero channels add nothing, so the result is the C-channel conv's.
    Set by select (select/conv.py ``pad_channels``) where it lets an sm90a TMA
    kernel run a conv whose C is not a multiple of 8 (a network's RGB stem).
    """

    c: int
    k: int
    h: int
    w: int
    r: int
    s: int
    dtype: str
    align_a: int
    align_b: int
    align_c: int
    pad: tuple = (0, 0, 0, 0)
    stride: tuple = (1, 1)
    dilation: tuple = (1, 1)
    epilogue: GemmEpilogue = GemmEpilogue()
    n: Optional[int] = None
    n_hint: int = 1
    tf32: bool = False
    pad_c: int = 0

    def __post_init__(self):
        _check(self.dtype, DTYPES, "dtype")
        for a in (self.align_a, self.align_b, self.align_c):
            _check(a, (1, 2, 4, 8), "alignment")
        if self.pad_c < 0:
            raise ValueError(f"pad_c must be >= 0, got {self.pad_c}")
        if min(self.c, self.k, self.h, self.w, self.r, self.s) < 1:
            raise ValueError(f"conv extents must be positive: {self}")
        if len(self.pad) != 4 or min(self.pad) < 0:
            raise ValueError(f"pad is (top, bottom, left, right) >= 0, got {self.pad}")
        if min(self.stride) < 1 or min(self.dilation) < 1:
            raise ValueError("stride and dilation must be >= 1")
        if self.p < 1 or self.q < 1:
            raise ValueError(f"empty conv output ({self.p} x {self.q})")
        if self.dtype == "f32" and not self.tf32:
            raise ValueError("fp32 convs run only as TF32, which must be opted in")

    @property
    def p(self) -> int:
        """Output height (PyTorch's formula, torch.nn.Conv2d docs)."""
        top, bottom = self.pad[0], self.pad[1]
        return (self.h + top + bottom - self.dilation[0] * (self.r - 1) - 1) // self.stride[0] + 1

    @property
    def q(self) -> int:
        left, right = self.pad[2], self.pad[3]
        return (self.w + left + right - self.dilation[1] * (self.s - 1) - 1) // self.stride[1] + 1

    @property
    def unit_stride(self) -> bool:
        return tuple(self.stride) == (1, 1)

    @property
    def c_kernel(self) -> int:
        """Input channels the kernel runs: C plus the zero channels of ``pad_c``."""
        return self.c + self.pad_c


@dataclass(frozen=True)
class ConvKernel:
    """One distinct conv2d fprop kernel instantiation (NHWC x KRSC -> NHWC).

    iterator: CUTLASS 2.x activation iterator algorithm ("optimized", "analytic",
    "few_channels", "fixed_channels"); "" for 3.x (TMA im2col).
    stride_support: "strided" or "unity" (2.x only; unity kernels need stride 1).
    Problem sizes, padding, stride and dilation are runtime arguments.
    """

    arch: str
    dtype: str
    align_a: int
    align_b: int
    align_c: int
    epilogue: GemmEpilogue
    config: KernelConfig
    iterator: str = "optimized"
    stride_support: str = "strided"
    accumulate: str = "f32"

    def __post_init__(self):
        _check(self.arch, ARCHS, "arch")
        _check(self.dtype, DTYPES, "dtype")
        _check(self.stride_support, ("strided", "unity"), "stride_support")
        if self.config.family == "cutlass3x_sm90":
            if self.arch != "sm90a":
                raise ValueError("CUTLASS 3.x sm90 kernels need the sm90a target")
            if self.iterator:
                raise ValueError("3.x conv kernels have no 2.x iterator algorithm")
        else:
            _check(self.iterator, CONV_ITERATORS, "iterator")

    kind = "conv2d_fprop"
    args_type = "CoConvArgs"
    layout_a = "nhwc"
    layout_b = "krsc"

    @property
    def name(self) -> str:
        fam = self.config.family
        it = f"_{self.iterator}" if self.iterator else ""
        unity = "_unity" if self.stride_support == "unity" else ""
        return (f"{fam}_conv2d_fprop_{self.dtype}_nhwc_{self.config.tag}{it}{unity}"
                f"_align{self.align_a}{self.align_b}{self.align_c}_{self.epilogue.tag}")


NORM_KINDS = ("layer_norm", "rms_norm")


@dataclass(frozen=True)
class NormProblem:
    """What one normalization region computes, over the LAST axis only:

    x viewed as (rows, cols), each row normalized in fp32 and rounded once:
      layer_norm: y = (x - mean) * rsqrt(var + eps) [* weight] [+ bias]  (biased var)
      rms_norm:   y = x * rsqrt(mean(x^2) + eps) [* weight]
    eps: as the graph gives it (the op's argument or the decomposed form's
    constant). cols: static; rows: ``None`` when dynamic (rows_hint = the
    example's). align: elements, the largest of 8/4/2/1 (4/2/1 for fp32) dividing
    cols. weight / bias: the affine (cols,) vectors are present. Norm regions have
    no fused epilogue (``epilogue`` is the empty GemmEpilogue, for the report).
    """

    kind: str
    dtype: str
    cols: int
    eps: float
    align: int
    weight: bool = False
    bias: bool = False
    rows: Optional[int] = None
    rows_hint: int = 1

    epilogue = GemmEpilogue()

    def __post_init__(self):
        _check(self.kind, NORM_KINDS, "kind")
        _check(self.dtype, DTYPES, "dtype")
        _check(self.align, (1, 2, 4, 8), "alignment")
        if self.cols < 1 or self.cols % self.align:
            raise ValueError(f"cols {self.cols} must be positive and a multiple of align {self.align}")
        if not (self.eps >= 0.0) or self.eps == float("inf"):
            raise ValueError(f"eps must be finite and >= 0, got {self.eps!r}")
        if self.bias and not self.weight:
            raise ValueError("a norm with a bias but no weight is not a PyTorch form")
        if self.bias and self.kind == "rms_norm":
            raise ValueError("rms_norm has no bias")


@dataclass(frozen=True)
class NormKernel:
    """One distinct row-wise normalization kernel (one row per thread block, or one
    warp per row for short rows; emit/norm.py). Its identity is dtype, kind,
    vector width (``vec`` elements per load, cols % vec == 0) and the affine
    parameters; rows, cols and eps are runtime arguments.

    config: KernelConfig of family "rowwise_norm", tile (1, 1, 1): no tuning
    choice is compiled in (the block size is picked per call from cols).
    """

    arch: str
    kind: str
    dtype: str
    vec: int
    weight: bool
    bias: bool
    config: "KernelConfig" = None

    def __post_init__(self):
        _check(self.arch, ARCHS, "arch")
        _check(self.kind, NORM_KINDS, "kind")
        _check(self.dtype, DTYPES, "dtype")
        _check(self.vec, (1, 2, 4) if self.dtype == "f32" else (1, 2, 4, 8), "vector width")
        if self.bias and not self.weight:
            raise ValueError("a norm kernel with a bias needs a weight")
        if self.config is None:
            object.__setattr__(self, "config", KernelConfig("rowwise_norm", (1, 1, 1), stages=0))
        elif self.config.family != "rowwise_norm":
            raise ValueError("norm kernels are of the rowwise_norm family")

    args_type = "CoNormArgs"
    layout_a = layout_b = "row"

    # the (A, B, C) alignments other kernel kinds have (build/shards.py reads them)
    @property
    def align_a(self) -> int:
        return self.vec

    align_b = align_c = align_a

    @property
    def affine(self) -> str:
        return "weight_bias" if self.bias else ("weight" if self.weight else "noaffine")

    @property
    def name(self) -> str:
        return f"rowwise_{self.kind}_{self.dtype}_vec{self.vec}_{self.affine}"


@dataclass(frozen=True)
class GroupNormProblem:
    """What one group_norm region computes: a 4-D (N, C, H, W) input, run NHWC
    (channel innermost in memory, i.e. a channels_last PyTorch tensor).

    The C channels split into ``groups`` consecutive groups of C / groups; per
    (n, group) the mean and biased variance over its H * W * C / groups elements,
    in fp32, then per element, rounded once to ``dtype``:
      y = (x - mean) * rsqrt(var + eps) [* weight[c]] [+ bias[c]]    [then silu(y)]
    c, h, w: static; n: ``None`` when dynamic (n_hint = the example's). eps: the
    graph's. align: elements, the largest of 8/4/2/1 (4/2/1 for fp32) dividing
    C / groups (a vector never straddles two groups). weight / bias: the
    per-channel (C,) affine vectors are present (each optional). silu: the
    group_norm's only user, an ``aten.silu``, is part of the region (``epilogue``
    then says "silu", for the report).
    """

    dtype: str
    c: int
    h: int
    w: int
    groups: int
    eps: float
    align: int
    weight: bool = False
    bias: bool = False
    silu: bool = False
    n: Optional[int] = None
    n_hint: int = 1

    def __post_init__(self):
        _check(self.dtype, DTYPES, "dtype")
        _check(self.align, (1, 2, 4) if self.dtype == "f32" else (1, 2, 4, 8), "alignment")
        if min(self.c, self.h, self.w, self.groups) < 1:
            raise ValueError(f"group_norm extents must be positive: {self}")
        if self.c % self.groups:
            raise ValueError(f"C={self.c} is not a multiple of groups={self.groups}")
        if self.channels_per_group % self.align:
            raise ValueError(f"C / groups = {self.channels_per_group} is not a multiple of "
                             f"align {self.align}")
        if not (self.eps >= 0.0) or self.eps == float("inf"):
            raise ValueError(f"eps must be finite and >= 0, got {self.eps!r}")

    @property
    def channels_per_group(self) -> int:
        return self.c // self.groups

    @property
    def epilogue(self) -> GemmEpilogue:
        return GemmEpilogue(activation="silu" if self.silu else "identity")


@dataclass(frozen=True)
class GroupNormKernel:
    """One distinct NHWC group_norm kernel (emit/group_norm.py): identity is dtype,
    vector width (``vec`` elements per load; C / groups % vec == 0), the affine
    parameters and the fused SiLU. N, C, H, W, groups and eps are runtime
    arguments; the launch shape is picked per call.

    config: KernelConfig of family "nhwc_group_norm", tile (1, 1, 1): no tuning
    choice is compiled in.
    """

    arch: str
    dtype: str
    vec: int
    weight: bool
    bias: bool
    silu: bool
    config: "KernelConfig" = None

    def __post_init__(self):
        _check(self.arch, ARCHS, "arch")
        _check(self.dtype, DTYPES, "dtype")
        _check(self.vec, (1, 2, 4) if self.dtype == "f32" else (1, 2, 4, 8), "vector width")
        if self.config is None:
            object.__setattr__(self, "config", KernelConfig("nhwc_group_norm", (1, 1, 1), stages=0))
        elif self.config.family != "nhwc_group_norm":
            raise ValueError("group_norm kernels are of the nhwc_group_norm family")

    kind = "group_norm"
    args_type = "CoGroupNormArgs"
    layout_a = layout_b = "nhwc"

    # the (A, B, C) alignments other kernel kinds have (build/shards.py reads them)
    @property
    def align_a(self) -> int:
        return self.vec

    align_b = align_c = align_a

    @property
    def affine(self) -> str:
        return {(True, True): "weight_bias", (True, False): "weight", (False, True): "bias",
                (False, False): "noaffine"}[self.weight, self.bias]

    @property
    def name(self) -> str:
        return (f"nhwc_group_norm_{self.dtype}_vec{self.vec}_{self.affine}"
                + ("_silu" if self.silu else ""))


# Attention (emit/attention.py: CUTLASS's fused multi-head attention, examples/41)
ATTENTION_DTYPES = ("f16", "bf16", "f32")
CAUSAL = ("none", "top_left", "bottom_right")
CAUSAL_CODE = {"none": 0, "top_left": 1, "bottom_right": 2}   # CoAttentionArgs.causal
ATTENTION_BIASES = ("none", "add")
BIAS_BROADCAST_DIMS = ("batch", "heads", "queries")
ATTENTION_LAYOUTS = ("bmhk",)
# Q/K/V access width in elements: aligned kernel (16 bytes) / not aligned (kMinimumAlignment)
ATTENTION_ALIGNED_ACCESS = {"f16": 8, "bf16": 8, "f32": 4}
ATTENTION_UNALIGNED_ACCESS = 4


@dataclass(frozen=True)
class AttentionProblem:
    """What one attention region computes, per batch b and head h:

    out[b, :, h, :] = softmax(scale * Q_bh @ K_bh^T + bias_bh, mask) @ V_bh
    with Q_bh (seq_q, head_dim), K_bh (seq_kv, head_dim), V_bh (seq_kv, head_dim_v),
    fp32 accumulation and softmax, output in ``dtype``.

    seq_q, seq_kv, batch: ``None`` when dynamic (all three are runtime arguments).
    causal: "none", "top_left" (query i sees keys j <= i: PyTorch is_causal=True,
      torch.nn.attention.bias.causal_upper_left) or "bottom_right" (j <= i + seq_kv
      - seq_q: causal_lower_right; needs seq_q <= seq_kv).
    bias: "none" or "add" (an additive float bias of the input dtype; a boolean
      mask becomes 0 / -inf). bias_broadcast: the dims of (batch, heads, queries)
      over which the bias is broadcast (stride 0), e.g. ("batch", "heads") for a
      (Mq, Nk) bias; keys cannot be broadcast (key stride 1).
    scale: the logit scale taken from the model (PyTorch default 1/sqrt(head_dim));
      any float is representable, the kernel takes finite scale > 0 (see module doc).
    layout: "bmhk", the kernel's native order (batch, seq, heads, head_dim) with
      runtime batch / seq / head strides for Q, K, V (any values, 0 broadcasts; so
      a PyTorch (B, H, L, E) tensor is used in place). The output is packed BMHK
      except for its seq stride (head stride head_dim_v, batch stride seq_q *
      seq stride), and the bias (B, H, Mq, Nk) has batch / head / query strides.
    align: elements, the largest of 8/4/2/1 dividing the Q/K/V pointers and all
      their strides (example inputs; checked again on every call): 8 (16-bit) or
      4 (f32) selects the aligned kernel, 4 the not-aligned one.
    """

    heads: int
    seq_q: Optional[int]
    seq_kv: Optional[int]
    head_dim: int
    head_dim_v: int
    dtype: str
    scale: float
    batch: Optional[int] = None
    causal: str = "none"
    bias: str = "none"
    bias_broadcast: tuple = ()
    align: int = 8
    layout: str = "bmhk"
    batch_hint: int = 1

    def __post_init__(self):
        _check(self.dtype, ATTENTION_DTYPES, "dtype")
        _check(self.causal, CAUSAL, "causal")
        _check(self.bias, ATTENTION_BIASES, "bias")
        _check(self.layout, ATTENTION_LAYOUTS, "layout")
        _check(self.align, (1, 2, 4, 8), "align")
        if self.heads < 1 or self.head_dim < 1 or self.head_dim_v < 1:
            raise ValueError(f"heads and head dims must be positive: heads={self.heads} "
                             f"head_dim={self.head_dim} head_dim_v={self.head_dim_v}")
        for what, n in (("batch", self.batch), ("seq_q", self.seq_q), ("seq_kv", self.seq_kv)):
            if n is not None and n < 0:
                raise ValueError(f"{what} must be >= 0 or None (dynamic), got {n}")
        if not isinstance(self.scale, numbers.Real) or isinstance(self.scale, bool):
            raise ValueError(f"scale must be a real number, got {self.scale!r}")
        object.__setattr__(self, "scale", float(self.scale))
        dims = tuple(self.bias_broadcast)
        if "keys" in dims:
            raise ValueError("a bias broadcast over keys is a per-row constant (softmax "
                             "ignores it unless it is -inf): drop it or materialize it; the "
                             "kernel reads bias rows with key stride 1")
        for d in dims:
            _check(d, BIAS_BROADCAST_DIMS, "bias_broadcast dim")
        if len(set(dims)) != len(dims):
            raise ValueError(f"bias_broadcast lists a dim twice: {dims}")
        if dims and self.bias == "none":
            raise ValueError("bias_broadcast needs a bias")
        # canonical order, so equal problems compare equal
        object.__setattr__(self, "bias_broadcast",
                           tuple(d for d in BIAS_BROADCAST_DIMS if d in dims))

    @property
    def epilogue(self) -> "AttentionVariant":
        """No fused epilogue: the report's epilogue column names the mask variant."""
        parts = [] if self.causal == "none" else [{"top_left": "causal",
                                                    "bottom_right": "causal_br"}[self.causal]]
        if self.bias != "none":
            parts.append("bias")
        return AttentionVariant("_".join(parts) or "plain")


@dataclass(frozen=True)
class AttentionVariant:
    """What the report lists in an attention region's "epilogue" column."""

    tag: str


@dataclass(frozen=True)
class AttentionKernel:
    """One distinct AttentionKernel<...> instantiation (examples/41 kernel_forward.h).

    config: KernelConfig(family "cutlass2x_sm80", tile = (kQueriesPerBlock,
      kKeysPerBlock, kMaxK), warp (32, 32, 32) and instruction (16, 8, 8) as the
      kernel hard-codes them, stages 4 (16-bit) / 3 (f32): the mainloop depth the
      kernel requests; informational, not a template parameter).
    aligned: isAligned (Q/K/V read 16 bytes at a time) vs 4-element accesses.
    supports_bias: kSupportsBias. kSupportsDropout is always false.
    The causal mask, all sizes, strides and the scale are runtime arguments.
    """

    arch: str
    dtype: str
    config: KernelConfig
    aligned: bool = True
    supports_bias: bool = False

    kind = "attention"
    args_type = "CoAttentionArgs"
    layout_a = layout_b = "bmhk"

    def __post_init__(self):
        _check(self.arch, ARCHS, "arch")
        _check(self.dtype, ATTENTION_DTYPES, "dtype")

    @property
    def queries_per_block(self) -> int:
        return self.config.tile[0]

    @property
    def keys_per_block(self) -> int:
        return self.config.tile[1]

    @property
    def max_k(self) -> int:
        return self.config.tile[2]

    @property
    def single_value_iteration(self) -> bool:
        """kSingleValueIteration: the output stays in registers ("rf")."""
        return self.max_k <= self.keys_per_block

    @property
    def needs_workspace(self) -> bool:
        """kNeedsOutputAccumulatorBuffer: fp32 running output in the workspace."""
        return not self.single_value_iteration and self.dtype != "f32"

    @property
    def access(self) -> int:
        """Q/K/V access width in elements (head dims and strides must be multiples)."""
        return ATTENTION_ALIGNED_ACCESS[self.dtype] if self.aligned else ATTENTION_UNALIGNED_ACCESS

    # the (A, B, C) alignments other kernel kinds have (build/shards.py reads them)
    @property
    def align_a(self) -> int:
        return self.access

    align_b = align_c = align_a

    @property
    def name(self) -> str:
        q, k, mk = self.config.tile
        mode = "rf" if self.single_value_iteration else "gmem"
        return (f"{self.config.family}_fmha_fwd_{self.dtype}_"
                f"{'aligned' if self.aligned else 'notaligned'}_{q}x{k}_k{mk}_{mode}"
                + ("_bias" if self.supports_bias else ""))


@dataclass(frozen=True)
class AttentionKernelSm90:
    """One Hopper fused multi-head attention forward instantiation (CUTLASS
    examples/88_hopper_fmha: TMA loads and stores, warp-specialized cooperative
    schedule, one producer and two consumer warpgroups; emit/attention_sm90.py).

    config: KernelConfig(family "cutlass3x_sm90", tile = (BlockQ, BlockKV,
      BlockHead): 128 queries per CTA (64 per consumer warpgroup) x keys per
      mainloop step x the head dim the tile holds (head dims below it are zero-filled
      by TMA and clipped by the TMA store), stages = K/V pipeline depth (kStagesKV,
      5 by default), kernel_schedule "KernelTmaWarpSpecializedCooperative").
    causal: the fusion is a template parameter: True = CausalFusion (top-left),
      False = ResidualFusion (no mask; keys past seq_kv in the last tile masked).
    Q/K/V/O are read and written 16 bytes at a time (TMA): head dim, pointers
    and strides multiples of 8 elements. The workspace holds the per-row
    log-sum-exp the kernel always writes (fp32, batch x heads x seq_q).
    """

    arch: str
    dtype: str
    config: KernelConfig
    causal: bool = False

    kind = "attention"
    args_type = "CoAttentionArgs"
    layout_a = layout_b = "bmhk"
    aligned = True
    supports_bias = False
    needs_workspace = True          # the log-sum-exp rows
    access = 8                      # elements per 16-byte TMA access (f16 / bf16)
    align_a = align_b = align_c = 8

    def __post_init__(self):
        _check(self.arch, ("sm90a",), "arch")
        _check(self.dtype, ("f16", "bf16"), "dtype")
        if self.config.family != "cutlass3x_sm90":
            raise ValueError(f"Hopper attention kernels are cutlass3x_sm90, got {self.config.family!r}")

    @property
    def head_tile(self) -> int:
        return self.config.tile[2]

    @property
    def name(self) -> str:
        q, k, d = self.config.tile
        return (f"cutlass3x_sm90_fmha_fwd_{self.dtype}_{q}x{k}x{d}_s{self.config.stages}_coop"
                + ("_causal" if self.causal else ""))


@dataclass(frozen=True)
class KernelSource:
    """C++ for one kernel: its includes (collected once per TU) and its code.

    code defines ``namespace <name> { int64_t workspace_size(const Args&);
    int run(const Args&, cudaStream_t); }`` where Args is ``args_type``
    (CoGemmArgs, CoConvArgs, CoNormArgs; emit/templates/prelude.h).
    """

    name: str
    includes: tuple
    code: str
    args_type: str = "CoGemmArgs"
    defines: tuple = ()      # macros the TU must define before its includes


def replace(obj, **changes):
    return dataclasses.replace(obj, **changes)


class _Region:
    """What every region has: ``nodes`` (FX node names in graph order) whose last one
    is the region's output."""

    @property
    def output(self) -> str:
        return self.nodes[-1]


@dataclass(frozen=True)
class GemmRegion(_Region):
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


@dataclass(frozen=True)
class ConvRegion(_Region):
    """A conv2d fprop subgraph to offload: the conv + its fused epilogue.

    nodes: FX node names in graph order (a leading zero ``constant_pad_nd`` folded
    into the conv's padding comes first); the last one is the region's output.
    x, w, bias, c: input node names by role; the graph is NCHW (PyTorch's logical
    layout) and the region module maps the tensors onto NHWC / KRSC.
    c: the residual: (N, K, P, Q), or a per-channel (K,)-sized tensor when
    ``problem.epilogue.residual_broadcast``.
    """

    name: str
    nodes: tuple
    x: str
    w: str
    problem: ConvProblem
    bias: Optional[str] = None
    c: Optional[str] = None
    notes: tuple = ()
    form: str = "conv2d"


@dataclass(frozen=True)
class NormRegion(_Region):
    """A layer_norm / rms_norm over the last axis to offload (no epilogue).

    nodes: FX node names in graph order, the last one the region's output (the
    ``aten.layer_norm`` / ``aten.rms_norm`` node alone, or every node of a
    decomposed RMS norm such as transformers' LlamaRMSNorm, with the
    ``_assert_tensor_metadata`` checks on its intermediates).
    x, weight, bias: input node names by role (weight and bias may be None).
    form: "layer_norm", "rms_norm" (the ATen op) or "rms_norm_decomposed".
    """

    name: str
    form: str
    nodes: tuple
    x: str
    problem: NormProblem
    weight: Optional[str] = None
    bias: Optional[str] = None
    notes: tuple = ()


@dataclass(frozen=True)
class GroupNormRegion(_Region):
    """An ``aten.group_norm`` on a 4-D input to offload, with the ``aten.silu`` that
    is its only user when ``problem.silu``.

    nodes: FX node names in graph order (the group_norm, then the silu); the last
    one is the region's output. x, weight, bias: input node names by role (weight
    and bias may be None). The graph is NCHW; the region module runs NHWC and
    returns a channels_last tensor.
    """

    name: str
    nodes: tuple
    x: str
    problem: GroupNormProblem
    weight: Optional[str] = None
    bias: Optional[str] = None
    notes: tuple = ()
    form: str = "group_norm"


@dataclass(frozen=True)
class AttentionRegion(_Region):
    """A fused multi-head attention subgraph to offload: ``aten.scaled_dot_product_attention``
    or the hand-written ``softmax(q @ k^T * scale [+ bias]) @ v`` (partition/attention.py).

    nodes: FX node names in graph order, the last one the region's output.
    q, k, v: input node names by role, as the graph gives them: (..., L, E) tensors of
      rank 4 (B, H, L, E) or 3 (N, L, E); with ``k_transposed`` the k input is K^T
      (..., E, S) (the hand-written form's ``k.transpose(-1, -2)`` when it is not part
      of the region).
    bias: input read as the kernel's additive bias, by ``bias_kind``: "float" (added
      to the scaled logits), "bool_keep" (SDPA's boolean mask, True = attend) or
      "bool_masked" (``masked_fill(logits, mask, -inf)``, True = masked); the region
      module turns a boolean mask into a 0 / -inf bias.
    mask: an input mask folded into ``problem.causal`` (or found to mask nothing): the
      kernel does not read it, the PyTorch fallback does. ``mask_check`` (its value
      depends on dynamic sizes): the region module compares it once per shape with the
      pattern before trusting the fold (``mask_kind`` says how to read it).
    negate: the model's scale is negative: the kernel runs with -scale on -Q (or -K).
    out_layout: "bmhk": the region's output is (B, L, H, Ev), contiguous (a transpose
      of SDPA's output joined the region); "strided": (B, H, L, Ev), a view of the
      kernel's BMHK output (rank 3: (N, L, Ev), contiguous); "contiguous": (B, H, L,
      Ev) copied contiguous (a user views it in a way the strided one does not allow).
    rank: 4 or 3 (q, k, v and the output).
    form: "sdpa" or "softmax_attention". Query rows that see no key give 0 in SDPA
      (PyTorch's rule) and NaN in the hand-written form (softmax over -inf), with the
      kernel as in PyTorch.
    """

    name: str
    form: str
    nodes: tuple
    q: str
    k: str
    v: str
    problem: AttentionProblem
    bias: Optional[str] = None
    bias_kind: str = "none"
    mask: Optional[str] = None
    mask_kind: str = "none"
    mask_check: bool = False
    k_transposed: bool = False
    negate: bool = False
    out_layout: str = "strided"
    rank: int = 4
    notes: tuple = ()

    def __post_init__(self):
        _check(self.form, ("sdpa", "softmax_attention"), "form")
        _check(self.out_layout, ("bmhk", "strided", "contiguous"), "out_layout")
        _check(self.rank, (3, 4), "rank")
        if self.out_layout == "bmhk" and self.rank != 4:
            raise ValueError("only a rank-4 output is transposed to BMHK")
        kinds = ("none", "float", "bool_keep", "bool_masked")
        _check(self.bias_kind, kinds, "bias_kind")
        _check(self.mask_kind, kinds, "mask_kind")
        if (self.bias is None) != (self.bias_kind == "none"):
            raise ValueError("bias and bias_kind go together")
        if (self.bias is not None) != (self.problem.bias == "add"):
            raise ValueError("a bias input needs a problem with bias='add', and back")

    @property
    def kernel_problem(self) -> AttentionProblem:
        """The problem as the kernel runs it: bottom-right causal attention with more
        queries than keys runs on the last seq_kv queries only (the region module
        fills the rows that see no key)."""
        p = self.problem
        if p.causal == "bottom_right" and p.seq_q is not None and p.seq_kv is not None \
                and p.seq_q > p.seq_kv:
            return dataclasses.replace(p, seq_q=p.seq_kv)
        return p


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
    regions: tuple           # GemmRegion | ConvRegion | NormRegion | GroupNormRegion
    kernels: tuple           # GemmKernel | ConvKernel | NormKernel | GroupNormKernel, parallel
    fallbacks: tuple

    @property
    def distinct_kernels(self) -> tuple:
        seen = {}
        for k in self.kernels:
            seen.setdefault(k.name, k)
        return tuple(seen.values())
