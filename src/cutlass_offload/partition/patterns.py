"""The pattern table for the GEMM family: anchors and epilogue stages, as data.

An anchor row names an ATen op and the function that reads its operands (or
raises UnsupportedRegion with a reason). An epilogue stage row names the ops it
accepts after the current region output and the checks (small named predicates,
see checks.py) that must all hold. Adding a pattern is one row plus a test.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import attention_forms as ATT
from . import checks as C
from . import conv as V
from . import group_norm as GN
from . import norm as NORM
from .graph_utils import aten


@dataclass(frozen=True)
class Anchor:
    form: str
    target: object
    operands: Callable        # (node, options) -> checks.Operands


@dataclass(frozen=True)
class Stage:
    name: str                 # which GemmEpilogue field it fills
    targets: tuple
    check: Callable           # (EpilogueState, node) -> str | None (reason to refuse)


ANCHORS = (
    Anchor("linear", aten.linear.default, C.linear_operands),
    Anchor("matmul", aten.matmul.default, C.matmul_operands),
    Anchor("mm", aten.mm.default, C.mm_operands),
    Anchor("addmm", aten.addmm.default, C.addmm_operands),
    Anchor("bmm", aten.bmm.default, C.bmm_operands),
    Anchor("conv2d", aten.conv2d.default, V.conv2d_operands),
    Anchor("conv2d", aten.conv2d.padding, V.conv2d_operands),
    Anchor("conv2d", aten.convolution.default, V.convolution_operands),
    # norms (partition/norm.py): no epilogue; the rsqrt row returns None for an rsqrt
    # that is not the statistic of a written-out RMS norm
    Anchor("layer_norm", aten.layer_norm.default, NORM.layer_norm_operands),
    Anchor("layer_norm", aten.native_layer_norm.default, NORM.native_layer_norm_operands),
    Anchor("rms_norm", aten.rsqrt.default, NORM.rsqrt_rms_operands),
    # group_norm (partition/group_norm.py), with the silu that is its only user
    Anchor("group_norm", aten.group_norm.default, GN.group_norm_operands),
) + ((Anchor("rms_norm", aten.rms_norm.default, NORM.rms_norm_operands),)
     if hasattr(aten, "rms_norm") else ())

EPILOGUE_STAGES = (
    Stage("bias", (aten.add.Tensor,),
          C.all_of(C.no_bias_yet, C.no_activation_yet, C.no_residual_yet, C.alpha_is_one,
                   C.other_is_column_vector, C.other_same_dtype)),
    Stage("activation", (aten.relu.default, aten.gelu.default, aten.silu.default, aten.sigmoid.default),
          C.all_of(C.no_activation_yet, C.no_residual_yet)),
    Stage("residual", (aten.add.Tensor, aten.mul.Tensor),
          C.all_of(C.no_residual_yet, C.alpha_is_one, C.other_is_full_shape, C.other_same_dtype,
                   C.other_independent_of_gemm)),
    Stage("post_activation", (aten.relu.default,),
          C.all_of(C.has_residual, C.no_post_activation_yet)),
)

ANCHOR_BY_TARGET = {a.target: a for a in ANCHORS}

# attention (partition/attention.py): matched in a pass of its own BEFORE the anchors
# above, so the GEMM anchors do not claim the matmuls of a hand-written attention;
# the softmax rows return None for a softmax that is not between q @ k^T and p @ v
ATTENTION_ANCHORS = (
    Anchor("sdpa", aten.scaled_dot_product_attention.default, ATT.sdpa_operands),
    Anchor("softmax_attention", aten.softmax.int, ATT.softmax_operands),
    Anchor("softmax_attention", aten._softmax.default, ATT.softmax_operands),
)
ATTENTION_BY_TARGET = {a.target: a for a in ATTENTION_ANCHORS}
