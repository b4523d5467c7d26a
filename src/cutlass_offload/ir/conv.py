"""conv2d fprop regions (implicit GEMM, NHWC): the problem, the kernel and the region."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from .common import (ARCHS, DTYPES, GemmEpilogue, KernelConfig, _check, _Region, config_from_dict,
                     config_to_dict)
from .gemm import GemmLaunch

CONV_ITERATORS = ("optimized", "analytic", "few_channels", "fixed_channels")
# 3.x: "" = TMA im2col implicit GEMM; "direct" / "im2col" = lowered onto the sm90
# GEMM (families/conv_gemm_sm90.py)
CONV_ITERATORS_3X = ("", "direct", "im2col")
# CUTLASS's conv::GroupMode kSingleGroup. Not kMultipleGroup (several whole groups per
# tile): on the H200 its 64x16 tiles wrote wrong rows (families/grouped_conv.py).
GROUP_MODES = ("single",)


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
    (``c_kernel``; 16-bit types; for a grouped conv the channels of one group,
    C / groups); align_c: the same for K. groups: 1; C for a depthwise conv (K = C,
    one input channel per filter; families/depthwise.py); or channel groups (C and
    K multiples of groups: ``grouped``, CUTLASS 2.x grouped fprop,
    families/grouped_conv.py).
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
    groups: int = 1

    def __post_init__(self):
        _check(self.dtype, DTYPES, "dtype")
        if self.groups != 1 and (self.groups < 1 or self.c % self.groups or self.k % self.groups
                                 or self.pad_c):
            raise ValueError(f"groups must be 1 or divide C = {self.c} and K = {self.k} (no "
                             f"pad_c), got {self.groups}")
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
    def depthwise(self) -> bool:
        """One input channel per output channel: groups = C = K."""
        return self.groups != 1 and self.groups == self.c == self.k

    @property
    def grouped(self) -> bool:
        """Channel groups that are not depthwise (ResNeXt, RegNet)."""
        return self.groups != 1 and not self.depthwise

    @property
    def c_kernel(self) -> int:
        """Input channels the kernel runs: C plus the zero channels of ``pad_c``."""
        return self.c + self.pad_c

    def summary(self) -> dict:
        """The problem as the report shows it (JSON-able)."""
        p = self
        return {"conv": {"n_hint": p.n_hint, "c": p.c, "h": p.h, "w": p.w, "k": p.k, "r": p.r,
                         "s": p.s, "pad": list(p.pad), "stride": list(p.stride),
                         "dilation": list(p.dilation), **({"pad_c": p.pad_c} if p.pad_c else {}),
                         **({"groups": p.groups} if p.groups != 1 else {})}}


@dataclass(frozen=True)
class ConvKernel:
    """One distinct conv2d fprop kernel instantiation (NHWC x KRSC -> NHWC).

    iterator: CUTLASS 2.x activation iterator algorithm ("optimized", "analytic",
    "few_channels", "fixed_channels"); for 3.x "" (TMA im2col implicit GEMM), or
    "direct" / "im2col": the conv lowered onto the sm90 GEMM
    (families/conv_gemm_sm90.py).
    stride_support: "strided" or "unity" (2.x only; unity kernels need stride 1).
    launch: the GEMM launch knobs of a lowered conv (raster order, swizzle, split-K /
    stream-K decomposition; ir.GemmLaunch), compiled into its launcher since the conv
    ABI carries none: part of the name when not the default. ``pdl`` is not taken
    (a lowered conv launches with PDL wherever its unit compiles grid dependency
    control: emit/conv_gemm_sm90.py).
    groups / group_mode: a grouped conv's channel groups, compiled in (2.x only;
    CUTLASS's GroupMode): "single" (each CTA's output tile lies in one group: K /
    groups a multiple of the tile's N; see GROUP_MODES).
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
    launch: GemmLaunch = GemmLaunch()
    groups: int = 1
    group_mode: str = ""

    def __post_init__(self):
        _check(self.arch, ARCHS, "arch")
        _check(self.dtype, DTYPES, "dtype")
        _check(self.stride_support, ("strided", "unity"), "stride_support")
        if (self.groups == 1) != (self.group_mode == ""):
            raise ValueError(f"group_mode is set exactly when groups > 1: groups {self.groups}, "
                             f"group_mode {self.group_mode!r}")
        if self.groups != 1:
            _check(self.group_mode, GROUP_MODES, "group_mode")
            if self.groups < 1 or self.config.family != "cutlass2x_sm80":
                raise ValueError("grouped convs run CUTLASS 2.x grouped fprop kernels only")
            if self.iterator not in ("analytic", "optimized"):
                raise ValueError("a grouped conv takes the analytic or the optimized iterator "
                                 "(CUTLASS's can_implement)")
        if self.config.family == "cutlass3x_sm90":
            if self.arch != "sm90a":
                raise ValueError("CUTLASS 3.x sm90 kernels need the sm90a target")
            _check(self.iterator, CONV_ITERATORS_3X, "iterator")
        else:
            _check(self.iterator, CONV_ITERATORS, "iterator")
        if self.launch != GemmLaunch():
            if self.iterator not in ("direct", "im2col"):
                raise ValueError("launch knobs are for convs lowered onto the sm90 GEMM only")
            if self.launch.pdl:
                raise ValueError("a lowered conv's PDL follows its unit's grid dependency "
                                 "control; launch.pdl must be False")
            if self.launch.decomposition != "heuristic" and self.config.tile_scheduler != "stream_k":
                raise ValueError(f"decomposition {self.launch.decomposition!r} needs the "
                                 "stream-K tile scheduler")

    kind = "conv2d_fprop"
    args_type = "CoConvArgs"
    layout_a = "nhwc"
    layout_b = "krsc"

    @property
    def name(self) -> str:
        fam = self.config.family
        it = f"_{self.iterator}" if self.iterator else ""
        unity = "_unity" if self.stride_support == "unity" else ""
        launch = "" if self.launch == GemmLaunch() else f"_{self.launch.tag}"
        groups = f"_g{self.groups}{self.group_mode[0]}" if self.groups != 1 else ""
        return (f"{fam}_conv2d_fprop_{self.dtype}_nhwc_{self.config.tag}{it}{launch}{unity}{groups}"
                f"_align{self.align_a}{self.align_b}{self.align_c}_{self.epilogue.tag}")


@dataclass(frozen=True)
class ConvChoice:
    """One sm90a conv kernel choice, what a conv search times and the learned conv
    table stores (families/conv_sm90_table.py): ``iterator`` "" (the TMA implicit
    GEMM), "direct" or "im2col" (lowered onto the sm90 GEMM), its ``config`` and, for
    a lowered conv, the GEMM's ``launch`` knobs (ConvKernel's fields of the same
    names)."""

    iterator: str
    config: KernelConfig
    launch: GemmLaunch = GemmLaunch()

    def __post_init__(self):
        _check(self.iterator, CONV_ITERATORS_3X, "iterator")

    @property
    def tag(self) -> str:
        """Short label: "<iterator or tma>_<config tag>[_<launch tag>]"."""
        launch = "" if self.launch == GemmLaunch() else f"_{self.launch.tag}"
        return f"{self.iterator or 'tma'}_{self.config.tag}{launch}"

    def to_dict(self) -> dict:
        return {"iterator": self.iterator, "config": config_to_dict(self.config),
                "launch": asdict(self.launch)}

    @classmethod
    def from_dict(cls, d: dict) -> ConvChoice:
        """The choice ``to_dict`` wrote; ValueError / KeyError / TypeError otherwise."""
        return cls(str(d["iterator"]), config_from_dict(d["config"]), GemmLaunch(**d.get("launch", {})))


@dataclass(frozen=True)
class DepthwiseKernel:
    """One direct depthwise conv2d fprop kernel (family ``direct_depthwise``,
    hand-written: emit/templates/depthwise.cuh): NHWC x and y, the (C, 1, R, S)
    filter, 16-bit types, fp32 accumulation, dilation 1.

    s: the filter width and stride_w: the horizontal stride, compiled in (they size
    the input window each thread holds); outputs: consecutive outputs along a row
    per thread (QT) of the row form. tiled: () for the row form alone, or (PT, QT,
    threads, min_blocks) of the tiled form (templates/depthwise_tiled.cuh: a block's
    input tile staged in shared memory, PT x QT outputs per thread, at most
    ``threads`` per block, launch bounds of ``min_blocks`` blocks per SM), which runs
    where R = S and stride_h = stride_w and the row form otherwise. R, the vertical
    stride, padding and every size are runtime arguments (CoConvArgs). The kernel
    reads x, y and the residual in 16-byte vectors (align 8); the filter is read as
    the contiguous run of each block's channels (16-byte vectors from a 16-byte
    aligned base, which ``run`` checks: a parameter's storage is), so the problem's
    filter alignment does not bind (align 1).
    """

    arch: str
    dtype: str
    epilogue: GemmEpilogue
    s: int
    stride_w: int
    outputs: int = 4
    config: Optional[KernelConfig] = None
    tiled: tuple = ()

    FAMILY = "direct_depthwise"

    def __post_init__(self):
        _check(self.arch, ARCHS, "arch")
        _check(self.dtype, ("f16", "bf16"), "dtype")
        if not 1 <= self.s <= 9 or self.stride_w not in (1, 2) or self.outputs not in (1, 2, 4, 8):
            raise ValueError(f"depthwise kernel: filter width 1-9, horizontal stride 1 or 2 and "
                             f"1/2/4/8 outputs per thread, got s={self.s}, stride_w={self.stride_w}, "
                             f"outputs={self.outputs}")
        object.__setattr__(self, "tiled", tuple(int(v) for v in self.tiled))
        if self.tiled and (len(self.tiled) != 4 or self.tiled[0] not in (1, 2, 4)
                           or self.tiled[1] not in (1, 2, 4) or self.tiled[2] not in (128, 256)
                           or self.tiled[3] not in (1, 2, 4)):
            raise ValueError(f"depthwise kernel: tiled is () or (PT, QT, threads, min_blocks) with PT "
                             f"and QT in 1/2/4, threads 128 or 256, min_blocks 1/2/4; got {self.tiled}")
        if self.config is None:
            object.__setattr__(self, "config", KernelConfig(self.FAMILY, (1, 1, 1), stages=0))
        elif self.config.family != self.FAMILY:
            raise ValueError(f"depthwise kernels are of the {self.FAMILY} family")

    kind = "conv2d_fprop"
    args_type = "CoConvArgs"
    layout_a = "nhwc"
    layout_b = "krsc"
    align_a = align_c = 8
    align_b = 1
    iterator = "depthwise"

    @property
    def name(self) -> str:
        tiled = "_t{}x{}_{}b{}".format(*self.tiled) if self.tiled else ""
        return (f"co_depthwise_conv2d_fprop_{self.dtype}_nhwc_s{self.s}_sw{self.stride_w}"
                f"_q{self.outputs}{tiled}_{self.epilogue.tag}")


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
