"""Operand readers of the conv2d anchors (``aten.conv2d``, ``aten.conv2d.padding``,
``aten.convolution``): what the conv computes, or UnsupportedRegion with a reason.

Only fprop on 4-D NCHW tensors with static C, H, W is offloaded (the batch may be
dynamic), with groups == 1, depthwise (groups = C = K, within the depthwise
kernel's limits: families/depthwise.py) or, with ``CUTLASS_OFFLOAD_GROUPED_CONV=1``,
channel groups (families/grouped_conv.py: CUTLASS 2.x grouped fprop, no residual
epilogue). A zero ``constant_pad_nd`` over H and W whose only user is the conv is
folded into the conv's (possibly asymmetric) padding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx as fx

from ..config import knobs
from ..errors import UnsupportedRegion
from ..families import conv_sm90, depthwise, grouped_conv
from ..ir import ConvProblem, ConvRegion, GemmEpilogue, Note
from .checks import fp32_reason
from .epilogue import grow_epilogue
from ..target import ALIASES, TARGETS
from .graph_utils import aten, hint_int, max_alignment, static_int, tensor_dtype, val


@dataclass
class ConvOperands:
    form: str
    a: fx.Node                  # x (N, C, H, W)
    b: fx.Node                  # weight (K, C, R, S)
    n: int                      # output channels K: the implicit GEMM's N
    c_in: int
    h: int
    w: int
    r: int
    s: int
    dtype: str
    batch: object               # int or SymInt
    pad: tuple                  # (top, bottom, left, right)
    stride: tuple
    dilation: tuple
    bias: Optional[fx.Node] = None
    c: Optional[fx.Node] = None
    pad_node: Optional[fx.Node] = None   # folded constant_pad_nd, joins the region
    groups: int = 1                      # C for a depthwise conv
    # why a per-sample (N, K, 1, 1) residual may not join (None: it may; _per_sample_refusal)
    per_sample_refusal: Optional[str] = "not checked"

    @property
    def grouped(self) -> bool:
        """Channel groups that are not depthwise (groups = C = K)."""
        return self.groups != 1 and not self.groups == self.c_in == self.n


def _pair(v, what) -> tuple:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if len(v) == 1:
        v = v * 2
    if len(v) != 2 or not all(isinstance(i, int) for i in v):
        raise UnsupportedRegion(f"{what} {v} is not two static ints")
    return tuple(v)


def _same_padding(r, s, dilation) -> tuple:
    """PyTorch's padding='same' (torch/nn/modules/conv.py, _conv_forward): total
    d * (k - 1) per dim, the extra pixel of an odd total at the bottom/right."""
    out = []
    for k, d in ((r, dilation[0]), (s, dilation[1])):
        total = d * (k - 1)
        out += [total // 2, total - total // 2]
    return tuple(out)


def _fold_pad(x: fx.Node, pad: tuple):
    """(input, padding, pad node) with a zero constant_pad_nd over H/W folded in."""
    if not (isinstance(x, fx.Node) and x.op == "call_function" and len(x.users) == 1
            and x.target in (aten.constant_pad_nd.default, aten.pad.default)):
        return x, pad, None
    amounts = list(x.args[1])
    if x.target == aten.pad.default:      # pad(input, pad, mode="constant", value=None)
        mode = x.args[2] if len(x.args) > 2 else x.kwargs.get("mode", "constant")
        value = x.args[3] if len(x.args) > 3 else x.kwargs.get("value", None)
        if mode != "constant":
            return x, pad, None
        value = 0 if value is None else value
    else:
        value = x.args[2] if len(x.args) > 2 else x.kwargs.get("value", 0)
    if value != 0 or len(amounts) > 4 or not all(isinstance(a, int) and a >= 0 for a in amounts):
        return x, pad, None
    if any(static_int(d) is None for d in val(x.args[0]).shape[1:]):
        return x, pad, None
    amounts += [0] * (4 - len(amounts))
    left, right, top, bottom = amounts          # F.pad order: last dim first
    t, b, l, r = pad
    return x.args[0], (t + top, b + bottom, l + left, r + right), x


def conv_operands(node, options, *, x, w, bias, stride, padding, dilation, groups,
                  transposed=False, form="conv2d") -> ConvOperands:
    if transposed:
        raise UnsupportedRegion("transposed convolution (dgrad-like) stays in PyTorch")
    if isinstance(groups, fx.Node):       # read off a shape (x.shape[1]): its value, if static
        groups = static_int(val(groups))
        if groups is None:
            raise UnsupportedRegion("convolution with a dynamic group count")
    grouped = False
    if groups != 1:
        c_in, k_out = static_int(val(x).shape[1]), static_int(val(w).shape[0])
        grouped = not (isinstance(groups, int) and groups == c_in == k_out)
        enabled = knobs().grouped_conv if options.grouped_conv is None else options.grouped_conv
        if grouped and not enabled:
            raise UnsupportedRegion(
                f"grouped convolution (groups={groups} with C={c_in}, K={k_out}: channel groups "
                "or a channel multiplier, not depthwise) stays in PyTorch: grouped convs are "
                "switched off for this compile (CUTLASS_OFFLOAD_GROUPED_CONV=0)")
    dtype = tensor_dtype(x, "input")
    if tensor_dtype(w, "weight") != dtype:
        raise UnsupportedRegion("input and weight dtypes differ")
    if dtype == "f32" and not options.allow_tf32:
        raise UnsupportedRegion(fp32_reason("conv", x, w))
    xv, wv = val(x), val(w)
    if xv.dim() != 4 or wv.dim() != 4:
        raise UnsupportedRegion("conv2d needs 4-D (N, C, H, W) input and (K, C, R, S) weight")
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    k, c_w, r, s = (static_int(d) for d in wv.shape)
    c, h, wd = (static_int(d) for d in xv.shape[1:])
    if None in (k, c_w, r, s):
        raise UnsupportedRegion("dynamic weight shape")
    if None in (c, h, wd):
        raise UnsupportedRegion("dynamic channels or spatial size (only the batch may be dynamic)")
    if c != c_w * groups:
        raise UnsupportedRegion(f"input channels {c} != weight channels {c_w} x groups {groups}")
    if isinstance(padding, str):
        if padding == "valid":
            pad = (0, 0, 0, 0)
        elif padding == "same":
            if stride != (1, 1):
                raise UnsupportedRegion("padding='same' with stride != 1")
            pad = _same_padding(r, s, dilation)
        else:
            raise UnsupportedRegion(f"padding mode {padding!r}")
    else:
        ph, pw = _pair(padding, "padding")
        pad = (ph, ph, pw, pw)
    if min(pad) < 0:
        raise UnsupportedRegion("negative padding")
    x_in, pad, pad_node = _fold_pad(x, pad)
    if pad_node is not None:
        c, h, wd = (static_int(d) for d in val(x_in).shape[1:])
    if bias is not None:
        bv = val(bias)
        if tensor_dtype(bias, "bias") != dtype or bv.dim() != 1 or static_int(bv.shape[0]) != k:
            raise UnsupportedRegion("conv bias must be a (K,) vector of the input dtype")
    ops = ConvOperands(form, x_in, w, k, c, h, wd, r, s, dtype, val(x_in).shape[0], pad, stride,
                       dilation, bias=bias, pad_node=pad_node, groups=groups)
    if groups != 1:
        # the depthwise / grouped kernels' own limits, with their reason (the epilogue
        # grows later)
        try:
            problem = _problem(ops, GemmEpilogue())
        except ValueError as e:          # an impossible problem (an empty output)
            raise UnsupportedRegion(str(e)) from None
        why = grouped_conv.reason(problem) if ops.grouped else depthwise.reason(problem)
        if why is not None:
            raise UnsupportedRegion(why)
    ops.per_sample_refusal = _per_sample_refusal(ops, options)
    return ops


def _per_sample_refusal(ops: ConvOperands, options) -> Optional[str]:
    """None when a per-sample (N, K, 1, 1) residual may join this conv's region, else
    why not. Only the sm90a TMA conv's epilogue reads one (its per-sample row
    broadcast, emit/templates/per_sample_broadcast.h): C and K multiples of 8, f16 /
    bf16, no channel groups, within TMA im2col's limits; select/conv.py leaves the
    add in the glue again where the conv's kernel is another one."""
    enabled = knobs().per_sample_add if options.per_sample_add is None else options.per_sample_add
    if not enabled:
        return ("it runs in the glue; CUTLASS_OFFLOAD_PER_SAMPLE_ADD=1 at compile fuses it into the "
                "sm_90a TMA conv's epilogue (experimental: correct, but measured slower in sd-unet)")
    arch = TARGETS[ALIASES[options.arch]].arch if options.arch else "sm90a"
    if arch != "sm90a":
        return "only the sm90a TMA conv's epilogue reads a per-sample vector; the add runs in the glue"
    if ops.groups != 1:
        return "a depthwise or grouped conv's kernel reads no per-sample vector; the add runs in the glue"
    try:
        problem = _problem(ops, GemmEpilogue())
    except ValueError as e:
        return str(e)
    if not conv_sm90.supports(problem):
        return ("only the sm90a TMA conv's epilogue reads a per-sample vector (f16 / bf16, C and K "
                "multiples of 8, TMA im2col's padding / stride limits); the add runs in the glue")
    return None


def _arg(node, i, name, default):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def conv2d_operands(node, options) -> ConvOperands:
    """aten.conv2d.default and aten.conv2d.padding (padding given as a string)."""
    return conv_operands(
        node, options, x=node.args[0], w=node.args[1], bias=_arg(node, 2, "bias", None),
        stride=_arg(node, 3, "stride", 1), padding=_arg(node, 4, "padding", 0),
        dilation=_arg(node, 5, "dilation", 1), groups=_arg(node, 6, "groups", 1))


def convolution_operands(node, options) -> ConvOperands:
    """aten.convolution.default (what AOTAutograd and full decomposition produce)."""
    if len(val(node.args[0]).shape) != 4:
        raise UnsupportedRegion("only 2-D convolution is offloaded")
    return conv_operands(
        node, options, x=node.args[0], w=node.args[1], bias=node.args[2], stride=node.args[3],
        padding=node.args[4], dilation=node.args[5], transposed=node.args[6],
        groups=node.args[8])


def batch_hint(ops: ConvOperands) -> int:
    return hint_int(ops.batch)


def make_conv_region(index, node, ops: ConvOperands, options, taken) -> tuple:
    """(ConvRegion, the nodes it takes: a folded zero pad too) for a matched conv
    anchor ``node``; ValueError for an impossible problem (an empty output)."""
    state = grow_epilogue(node, ops, taken)
    region = _make_conv_region(index, node, ops, state)
    return region, list(state.nodes) + ([ops.pad_node] if ops.pad_node is not None else [])


def _problem(ops: ConvOperands, epilogue: GemmEpilogue) -> ConvProblem:
    dtype = ops.dtype
    # a grouped conv reads each group's C / groups channels apart: the alignment of those
    c_read = ops.c_in // ops.groups if ops.grouped else ops.c_in
    return ConvProblem(
        c=ops.c_in, k=ops.n, h=ops.h, w=ops.w, r=ops.r, s=ops.s, dtype=dtype,
        align_a=max_alignment(c_read, dtype), align_b=max_alignment(ops.c_in // ops.groups, dtype),
        align_c=max_alignment(ops.n, dtype), pad=ops.pad, stride=ops.stride,
        dilation=ops.dilation, epilogue=epilogue, n=static_int(ops.batch),
        n_hint=max(1, batch_hint(ops)), tf32=dtype == "f32", groups=ops.groups)


def _make_conv_region(index, anchor, ops: ConvOperands, state) -> ConvRegion:
    epilogue = GemmEpilogue(bias=state.bias, activation=state.activation,
                            residual=state.residual, post_activation=state.post_activation,
                            residual_broadcast=state.residual_broadcast,
                            residual_per_sample=state.residual_per_sample)
    problem = _problem(ops, epilogue)
    nodes = ([ops.pad_node] if ops.pad_node is not None else []) + list(state.nodes)
    notes = tuple(state.notes)
    xv = val(ops.a)
    if (ops.a.op == "placeholder" and xv.dim() == 4 and xv.shape[1] != 1
            and not xv.is_contiguous(memory_format=torch.channels_last)):
        # later convs read our NHWC outputs; a model input in NCHW is copied every call
        fix = "pass it channels_last: x.contiguous(memory_format=torch.channels_last)"
        notes += (Note(f"input {ops.a.name} is NCHW: copied to NHWC on every call ({fix})",
                       f"a model input is NCHW: copied to NHWC on every call ({fix})"),)
    return ConvRegion(
        name=f"region{index}_conv2d_{epilogue.tag}", nodes=tuple(n.name for n in nodes),
        x=ops.a.name, w=ops.b.name, problem=problem,
        bias=ops.bias.name if ops.bias is not None else None,
        c=state.c.name if state.c is not None else None, notes=notes)
