"""The pattern table: one row per anchor op, as data.

A row names an ATen op, the function that reads its operands (None: not this
pattern after all; UnsupportedRegion: a refusal with its reason) and the region
maker of its kind (the kind's module: gemm.py, conv.py, norm.py, group_norm.py,
attention.py), which grows what the region takes (a GEMM's epilogue: epilogue.py
and its stage table) and returns the region. Adding a pattern is one row plus a
test; adding a region kind is its modules plus rows here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import attention as A
from . import attention_forms as ATT
from . import checks as C
from . import conv as V
from . import gemm as G
from . import group_norm as GN
from . import norm as NORM
from .graph_utils import aten


@dataclass(frozen=True)
class Anchor:
    form: str
    target: object
    operands: Callable        # (node, options) -> operands, or None: not this pattern after all
    make: Callable            # (index, node, operands, options, taken) -> (region, nodes taken)
    first: bool = False       # matched in a pass before the others (attention owns its matmuls)


ANCHORS = (
    # attention (attention_forms.py), matched in a pass of its own BEFORE the rows
    # below, so the GEMM anchors do not claim the matmuls of a hand-written attention;
    # the softmax rows return None for a softmax not between q @ k^T and p @ v
    Anchor("sdpa", aten.scaled_dot_product_attention.default, ATT.sdpa_operands,
           A.make_attention, first=True),
    Anchor("softmax_attention", aten.softmax.int, ATT.softmax_operands, A.make_attention, first=True),
    Anchor("softmax_attention", aten._softmax.default, ATT.softmax_operands, A.make_attention,
           first=True),
    Anchor("linear", aten.linear.default, C.linear_operands, G.make_gemm_region),
    Anchor("matmul", aten.matmul.default, C.matmul_operands, G.make_gemm_region),
    Anchor("mm", aten.mm.default, C.mm_operands, G.make_gemm_region),
    Anchor("addmm", aten.addmm.default, C.addmm_operands, G.make_gemm_region),
    Anchor("bmm", aten.bmm.default, C.bmm_operands, G.make_gemm_region),
    Anchor("conv2d", aten.conv2d.default, V.conv2d_operands, V.make_conv_region),
    Anchor("conv2d", aten.conv2d.padding, V.conv2d_operands, V.make_conv_region),
    Anchor("conv2d", aten.convolution.default, V.convolution_operands, V.make_conv_region),
    # norms (partition/norm.py): no epilogue; the rsqrt row returns None for an rsqrt
    # that is not the statistic of a written-out RMS norm
    Anchor("layer_norm", aten.layer_norm.default, NORM.layer_norm_operands, NORM.make_norm),
    Anchor("layer_norm", aten.native_layer_norm.default, NORM.native_layer_norm_operands, NORM.make_norm),
    Anchor("rms_norm", aten.rsqrt.default, NORM.rsqrt_rms_operands, NORM.make_norm),
    # group_norm (partition/group_norm.py), with the silu that is its only user
    Anchor("group_norm", aten.group_norm.default, GN.group_norm_operands, GN.make_group_norm),
) + ((Anchor("rms_norm", aten.rms_norm.default, NORM.rms_norm_operands, NORM.make_norm),)
     if hasattr(aten, "rms_norm") else ())

ANCHOR_BY_TARGET = {a.target: a for a in ANCHORS}
