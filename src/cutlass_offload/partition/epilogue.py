"""Epilogue growth: from an anchor's output, take its one user while a stage row
accepts it (bias, activation, residual, post activation), so the region's kernel
computes ``post(residual(act(acc + bias), C))``. The stage table is data: a row
names the ops it accepts after the current region output and the checks (small
named predicates, checks.py) that must all hold. Growth stops where the current
output has more than one user (no intermediate leaks out of the region), at a
node another region took, or at an op no row accepts (the note says why).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.fx as fx

from ..ir import note_not_fused, note_stops
from . import checks as C
from .checks import ACTIVATION_NAMES, EpilogueState
from .graph_utils import aten, same_shape, val


@dataclass(frozen=True)
class Stage:
    name: str                 # which GemmEpilogue field it fills
    targets: tuple
    check: Callable           # (EpilogueState, node) -> str | None (reason to refuse)


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


def grow_epilogue(anchor: fx.Node, ops, taken) -> EpilogueState:
    state = EpilogueState(anchor=anchor, operands=ops, out=anchor, nodes=[anchor],
                          bias=ops.bias is not None, c=ops.c,
                          residual="add" if ops.c is not None else "none")
    notes = []
    while True:
        users = list(state.out.users)
        if len(users) != 1:
            if len(users) > 1:
                notes.append(note_stops("epilogue", state.out.name, len(users)))
            break
        u = users[0]
        if u.op != "call_function" or u in taken:
            break
        stage, refusal = _match_stage(state, u)
        if stage is None:
            if refusal:
                notes.append(note_not_fused(u.name, refusal))
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
