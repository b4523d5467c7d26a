"""Partition: ATen graph -> GEMM regions (the bring-your-own-codegen step).

For each anchor op in the pattern table, read its operands (refusals become
fallbacks with a reason), then grow the epilogue one user at a time through the
stage table while the current output has exactly one user (so no intermediate
leaks out of the region). Regions never overlap: a node joins at most one.
"""
from __future__ import annotations

import logging
import math

import torch.fx as fx

from ..config import CompileOptions
from ..errors import UnsupportedRegion
from ..ir import ConvProblem, ConvRegion, Fallback, GemmEpilogue, GemmProblem, GemmRegion, PartitionResult
from .checks import ACTIVATION_NAMES, EpilogueState, m_hint
from .conv import ConvOperands, batch_hint
from .graph_utils import max_alignment, same_shape, static_int, val
from .group_norm import GroupNormOperands, make_group_norm_region
from .norm import NormOperands, make_norm_region
from .attention import make_attention_region
from .patterns import ANCHOR_BY_TARGET, ATTENTION_BY_TARGET, EPILOGUE_STAGES

log = logging.getLogger(__name__)


def partition(gm: fx.GraphModule, options: CompileOptions = CompileOptions()) -> PartitionResult:
    """Find GEMM regions in a canonicalized ATen graph with FakeTensor metadata.

    Returns a PartitionResult; never raises for an unsupported op (it becomes a
    Fallback). Node names in the result refer to ``gm.graph``.
    """
    regions, fallbacks, taken = [], [], set()
    _attention_pass(gm, options, regions, fallbacks, taken)   # first: it owns its matmuls
    for node in gm.graph.nodes:
        if node.op != "call_function" or node in taken:
            continue
        anchor = ANCHOR_BY_TARGET.get(node.target)
        if anchor is None:
            continue
        try:
            ops = anchor.operands(node, options)
        except UnsupportedRegion as e:
            fallbacks.append(Fallback(node.name, anchor.form, str(e)))
            log.info("fallback %s (%s): %s", node.name, anchor.form, e)
            continue
        if ops is None:                # not the anchor's pattern after all (a plain rsqrt)
            continue
        if isinstance(ops, (NormOperands, GroupNormOperands)):   # norms: no epilogue growth
            why = _left_to_glue(ops, options)
            if why:
                fallbacks.append(Fallback(node.name, anchor.form, why))
                continue
            if any(n in taken for n in ops.nodes):
                fallbacks.append(Fallback(node.name, anchor.form, "overlaps another region"))
                continue
            make = make_group_norm_region if isinstance(ops, GroupNormOperands) else make_norm_region
            try:
                region = make(len(regions), ops)
            except ValueError as e:
                fallbacks.append(Fallback(node.name, anchor.form, str(e)))
                continue
            regions.append(region)
            taken.update(ops.nodes)
            continue
        state = _grow_epilogue(node, ops, taken)
        make = _make_conv_region if isinstance(ops, ConvOperands) else _make_region
        try:
            region = make(len(regions), node, ops, state)
        except ValueError as e:        # e.g. an empty conv output
            fallbacks.append(Fallback(node.name, anchor.form, str(e)))
            continue
        regions.append(region)
        taken.update(state.nodes)
        if getattr(ops, "pad_node", None) is not None:
            taken.add(ops.pad_node)
    return PartitionResult(tuple(regions), tuple(fallbacks))


def _left_to_glue(ops, options) -> str | None:
    """Why a norm stays in the graph by choice (``options.offload_norms``), or None."""
    norms = options.offload_norms
    if norms == "none" or (norms == "group" and isinstance(ops, NormOperands)):
        return (f"left to the glue by choice (offload_norms={norms!r}): Inductor fuses it with "
                "its neighbours, which a region would prevent")
    return None


def _attention_pass(gm, options, regions, fallbacks, taken) -> None:
    """Attention regions (partition/attention.py), before any GEMM anchor: a
    hand-written attention's q @ k^T and p @ v matmuls belong to it. An attention
    that falls back leaves its matmuls to the GEMM anchors."""
    by_name = {n.name: n for n in gm.graph.nodes}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node in taken:
            continue
        anchor = ATTENTION_BY_TARGET.get(node.target)
        if anchor is None:
            continue
        try:
            ops = anchor.operands(node, options)
            if ops is None:            # a softmax that is not attention
                continue
            if any(n in taken for n in ops.nodes):
                raise UnsupportedRegion("overlaps another region")
            region = make_attention_region(len(regions), ops)
        except UnsupportedRegion as e:
            fallbacks.append(Fallback(node.name, anchor.form, str(e)))
            log.info("fallback %s (%s): %s", node.name, anchor.form, e)
            continue
        regions.append(region)
        taken.update(by_name[n] for n in region.nodes)


def _grow_epilogue(anchor: fx.Node, ops, taken) -> EpilogueState:
    state = EpilogueState(anchor=anchor, operands=ops, out=anchor, nodes=[anchor],
                          bias=ops.bias is not None, c=ops.c,
                          residual="add" if ops.c is not None else "none")
    notes = []
    while True:
        users = list(state.out.users)
        if len(users) != 1:
            if len(users) > 1:
                notes.append(f"epilogue stops at {state.out.name}: used {len(users)} times")
            break
        u = users[0]
        if u.op != "call_function" or u in taken:
            break
        stage, refusal = _match_stage(state, u)
        if stage is None:
            if refusal:
                notes.append(f"{u.name} not fused: {refusal}")
            break
        _apply(stage, state, u)
    state.notes = notes
    return state


def _match_stage(state, node):
    refusals = []
    for stage in EPILOGUE_STAGES:
        if node.target not in stage.targets:
            continue
        r = stage.check(state, node)
        if r is None:
            return stage, None
        refusals.append(f"as {stage.name}: {r}")
    return None, "; ".join(refusals)


def _apply(stage, state, node):
    other = None
    if len(node.args) == 2:
        other = node.args[1] if node.args[0] is state.out else node.args[0]
    if stage.name == "bias":
        state.bias = True
        state.operands.bias = other
    elif stage.name == "activation":
        state.activation = ACTIVATION_NAMES[node.target](node)
    elif stage.name == "residual":
        state.residual = "add" if "add" in str(node.target) else "mul"
        state.residual_broadcast = not same_shape(val(other).shape, val(state.out).shape)
        state.c = other
    elif stage.name == "post_activation":
        state.post_activation = "relu"
    state.out = node
    state.nodes.append(node)


def _make_region(index, anchor, ops, state) -> GemmRegion:
    dtype = ops.dtype
    epilogue = GemmEpilogue(bias=state.bias, activation=state.activation,
                            residual=state.residual, post_activation=state.post_activation)
    m_dims = ops.m_dims
    m_static = [static_int(d) for d in m_dims]
    m = None if any(s is None for s in m_static) else int(math.prod(m_static))
    batch = None
    if ops.batch_mode == "fold":
        batch = 1
    elif all(static_int(d) is not None for d in ops.batch_dims):
        batch = int(math.prod(static_int(d) for d in ops.batch_dims))
    layout_b = "col" if ops.b_nk else ("row" if static_int(val(ops.b).stride(-1)) == 1 else "col")
    align_b = max_alignment(ops.k if layout_b == "col" else ops.n, dtype)
    problem = GemmProblem(
        n=ops.n, k=ops.k, dtype=dtype, layout_b=layout_b,
        align_a=max_alignment(ops.k, dtype), align_b=align_b, align_c=max_alignment(ops.n, dtype),
        epilogue=epilogue, m=m, m_hint=max(1, m_hint(m_dims)), batch=batch,
        batch_hint=max(1, m_hint(ops.batch_dims)) if ops.batch_mode != "fold" else 1,
        a_batch_broadcast=ops.batch_mode == "a_broadcast", tf32=dtype == "f32")
    name = f"region{index}_{ops.form}_{epilogue.tag}"
    return GemmRegion(
        name=name, form=ops.form, nodes=tuple(n.name for n in state.nodes),
        a=ops.a.name, b=ops.b.name, problem=problem,
        bias=ops.bias.name if ops.bias is not None else None,
        c=state.c.name if state.c is not None else None,
        b_nk=ops.b_nk, batch_mode=ops.batch_mode, notes=tuple(state.notes))


def _make_conv_region(index, anchor, ops: ConvOperands, state) -> ConvRegion:
    dtype = ops.dtype
    epilogue = GemmEpilogue(bias=state.bias, activation=state.activation,
                            residual=state.residual, post_activation=state.post_activation,
                            residual_broadcast=state.residual_broadcast)
    problem = ConvProblem(
        c=ops.c_in, k=ops.n, h=ops.h, w=ops.w, r=ops.r, s=ops.s, dtype=dtype,
        align_a=max_alignment(ops.c_in, dtype), align_b=max_alignment(ops.c_in, dtype),
        align_c=max_alignment(ops.n, dtype), pad=ops.pad, stride=ops.stride,
        dilation=ops.dilation, epilogue=epilogue, n=static_int(ops.batch),
        n_hint=max(1, batch_hint(ops)), tf32=dtype == "f32")
    nodes = ([ops.pad_node] if ops.pad_node is not None else []) + list(state.nodes)
    return ConvRegion(
        name=f"region{index}_conv2d_{epilogue.tag}", nodes=tuple(n.name for n in nodes),
        x=ops.a.name, w=ops.b.name, problem=problem,
        bias=ops.bias.name if ops.bias is not None else None,
        c=state.c.name if state.c is not None else None, notes=tuple(state.notes))
