"""Normalization regions: row-wise layer_norm / rms_norm over the last axis, and
NHWC group_norm (with an optional fused SiLU): problems, kernels and regions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .common import ARCHS, DTYPES, GemmEpilogue, KernelConfig, _check, _Region

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
    cols. weight / bias: the affine (cols,) vectors are present. unit_offset: the
    weight is zero-centred, y is scaled by (1 + weight) computed in fp32 (Gemma's
    RMSNorm, ``x_norm * (1.0 + weight.float())``; Nemotron's LayerNorm1P). Norm regions have
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
    unit_offset: bool = False

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
        if self.unit_offset and not self.weight:
            raise ValueError("unit_offset scales by 1 + weight: it needs a weight")

    def summary(self) -> dict:
        """The problem as the report shows it (JSON-able)."""
        p = self
        return {"norm": {"kind": p.kind, "rows_hint": p.rows_hint, "cols": p.cols, "eps": p.eps,
                         "weight": p.weight, "bias": p.bias,
                         **({"unit_offset": True} if p.unit_offset else {})}}


class _VectorKernel:
    """What the hand-written vectorized norm kernels share: a fixed config of their
    family (no tuning choice compiled in) and the (A, B, C) alignments other kernel
    kinds have (build/shards.py reads them), all ``vec``."""

    FAMILY = ""

    def _check_common(self) -> None:
        """Target, dtype, vector width and config (the family's default when None)."""
        _check(self.arch, ARCHS, "arch")
        _check(self.dtype, DTYPES, "dtype")
        _check(self.vec, (1, 2, 4) if self.dtype == "f32" else (1, 2, 4, 8), "vector width")
        if self.config is None:
            object.__setattr__(self, "config", KernelConfig(self.FAMILY, (1, 1, 1), stages=0))
        elif self.config.family != self.FAMILY:
            raise ValueError(f"{self.kind} kernels are of the {self.FAMILY} family")

    @property
    def align_a(self) -> int:
        return self.vec

    align_b = align_c = align_a


@dataclass(frozen=True)
class NormKernel(_VectorKernel):
    """One distinct row-wise normalization kernel (one row per thread block, or one
    warp per row for short rows; emit/norm.py). Its identity is dtype, kind,
    vector width (``vec`` elements per load, cols % vec == 0) and the affine
    parameters (``unit_offset``: scaled by 1 + weight); rows, cols and eps are
    runtime arguments.

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
    unit_offset: bool = False

    def __post_init__(self):
        _check(self.kind, NORM_KINDS, "kind")
        if self.bias and not self.weight:
            raise ValueError("a norm kernel with a bias needs a weight")
        if self.unit_offset and not self.weight:
            raise ValueError("a norm kernel scaling by 1 + weight needs a weight")
        self._check_common()

    FAMILY = "rowwise_norm"
    args_type = "CoNormArgs"
    layout_a = layout_b = "row"

    @property
    def affine(self) -> str:
        w = "weight1p" if self.unit_offset else "weight"
        return f"{w}_bias" if self.bias else (w if self.weight else "noaffine")

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

    def summary(self) -> dict:
        """The problem as the report shows it (JSON-able)."""
        p = self
        return {"group_norm": {"n_hint": p.n_hint, "c": p.c, "h": p.h, "w": p.w, "groups": p.groups,
                               "eps": p.eps, "weight": p.weight, "bias": p.bias, "silu": p.silu}}


@dataclass(frozen=True)
class GroupNormKernel(_VectorKernel):
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
        self._check_common()

    FAMILY = "nhwc_group_norm"
    kind = "group_norm"
    args_type = "CoGroupNormArgs"
    layout_a = layout_b = "nhwc"

    @property
    def affine(self) -> str:
        return {(True, True): "weight_bias", (True, False): "weight", (False, True): "bias",
                (False, False): "noaffine"}[self.weight, self.bias]

    @property
    def name(self) -> str:
        return (f"nhwc_group_norm_{self.dtype}_vec{self.vec}_{self.affine}"
                + ("_silu" if self.silu else ""))


@dataclass(frozen=True)
class NormRegion(_Region):
    """A layer_norm / rms_norm over the last axis to offload (no epilogue).

    nodes: FX node names in graph order, the last one the region's output (the
    ``aten.layer_norm`` / ``aten.rms_norm`` node alone, or every node of a
    decomposed RMS norm such as transformers' LlamaRMSNorm, with the
    ``_assert_tensor_metadata`` checks on its intermediates).
    x, weight, bias: input node names by role (weight and bias may be None).
    form: "layer_norm", "rms_norm" (the ATen op), "rms_norm_decomposed" or
      "layer_norm_decomposed" (written out: partition/norm.py).
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
