"""Operand reader of ``aten.group_norm`` (and the SiLU after it), or
UnsupportedRegion with a reason (the op stays in PyTorch).

Matched: ``aten.group_norm.default(input, num_groups, weight, bias, eps,
cudnn_enabled)`` on a 4-D (N, C, H, W) fp16 / bf16 / fp32 input with static C, H
and W (the batch may be dynamic), C a multiple of num_groups, weight and bias
each absent or a (C,) vector of the input's dtype, eps a constant (the schema's
1e-5 when the graph leaves it out). When the group_norm's only user is
``aten.silu.default`` (diffusers' ResnetBlock2D: GroupNorm -> SiLU -> conv), the
SiLU joins the region. The kernel runs NHWC (emit/group_norm.py); the region
module hands back a channels_last tensor.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx as fx

from ..errors import UnsupportedRegion
from ..ir import GroupNormProblem, GroupNormRegion, note_not_fused
from .graph_utils import aten, hint_int, max_alignment, static_int, tensor_dtype, val
from .norm import _arg, _eps, _vector, norm_maker

MAX_VECTOR_COLUMNS = 512     # vectors across one group that one thread block holds (emit/group_norm.py)


@dataclass
class GroupNormOperands:
    x: fx.Node
    dtype: str
    n: Optional[int]             # None when dynamic
    n_hint: int
    c: int
    h: int
    w: int
    groups: int
    eps: float
    nodes: list                  # the group_norm [, the silu]; the last is the output
    weight: Optional[fx.Node] = None
    bias: Optional[fx.Node] = None
    silu: bool = False
    notes: list = field(default_factory=list)


def group_norm_operands(node, options) -> GroupNormOperands:
    """aten.group_norm.default(input, num_groups, weight, bias, eps, cudnn_enabled)."""
    x = node.args[0]
    dtype = tensor_dtype(x, "input")
    xv = val(x)
    if xv.dim() != 4:
        raise UnsupportedRegion(f"group_norm on a {xv.dim()}-D input: only 4-D (N, C, H, W) "
                                "inputs are offloaded")
    n_dim, *chw = xv.shape
    c, h, w = (static_int(d) for d in chw)
    if None in (c, h, w):
        raise UnsupportedRegion("group_norm with a dynamic C, H or W (only the batch may be dynamic)")
    if min(c, h, w) < 1:
        raise UnsupportedRegion("group_norm on an empty input")
    groups = _arg(node, 1, "num_groups")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise UnsupportedRegion(f"group_norm: num_groups {groups!r} is not a positive constant")
    if c % groups:
        raise UnsupportedRegion(f"group_norm: C={c} is not a multiple of num_groups={groups}")
    cpg = c // groups
    if cpg // max_alignment(cpg, dtype) > MAX_VECTOR_COLUMNS:
        raise UnsupportedRegion(f"group_norm: {cpg} channels per group do not fit one thread block "
                                f"({MAX_VECTOR_COLUMNS} vectors of {max_alignment(cpg, dtype)})")
    weight = _vector(_arg(node, 2, "weight"), "weight", dtype, c)
    bias = _vector(_arg(node, 3, "bias"), "bias", dtype, c)
    eps = _eps(_arg(node, 4, "eps"), "group_norm")
    if tuple(val(node).shape) != tuple(xv.shape) or val(node).dtype != xv.dtype:
        raise UnsupportedRegion("group_norm: the output differs from the input in shape or dtype")
    nodes, silu, notes = [node], False, []
    users = list(node.users)
    if len(users) == 1 and _is_silu(users[0]):
        nodes.append(users[0])
        silu = True
    elif len(users) > 1 and any(_is_silu(u) for u in users):
        silu_node = next(u for u in users if _is_silu(u))
        notes.append(note_not_fused(silu_node.name, f"the group_norm output is used {len(users)} times"))
    n = static_int(n_dim)
    return GroupNormOperands(x=x, dtype=dtype, n=n, n_hint=max(1, hint_int(n_dim)), c=c, h=h, w=w,
                             groups=groups, eps=eps, nodes=nodes, weight=weight, bias=bias,
                             silu=silu, notes=notes)


def _is_silu(n) -> bool:
    return (n.op == "call_function" and n.target is aten.silu.default and len(n.args) == 1
            and not n.kwargs and isinstance(val(n), torch.Tensor))


def make_group_norm_region(index: int, ops: GroupNormOperands) -> GroupNormRegion:
    """The GroupNormRegion of a matched group_norm (ValueError for an impossible problem)."""
    problem = GroupNormProblem(
        dtype=ops.dtype, c=ops.c, h=ops.h, w=ops.w, groups=ops.groups, eps=ops.eps,
        align=max_alignment(ops.c // ops.groups, ops.dtype), weight=ops.weight is not None,
        bias=ops.bias is not None, silu=ops.silu, n=ops.n, n_hint=ops.n_hint)
    return GroupNormRegion(
        name=f"region{index}_group_norm" + ("_silu" if ops.silu else ""),
        nodes=tuple(n.name for n in ops.nodes), x=ops.x.name, problem=problem,
        weight=ops.weight.name if ops.weight is not None else None,
        bias=ops.bias.name if ops.bias is not None else None, notes=tuple(ops.notes))


# with the SiLU it owns; see norm.norm_maker
make_group_norm = norm_maker(True, make_group_norm_region)
