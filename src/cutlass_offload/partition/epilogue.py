"""Epilogue growth: from an anchor's output, take its one user while a stage row
accepts it (bias, activation, residual, post activation), so the region's kernel
computes ``post(residual(act(acc + bias), C))``. The stage table is data: a row
names the ops it accepts after the current region output and the checks (small
named predicates, checks.py) that must all hold. Growth stops where the current
output has more than one user (no intermediate leaks out of the region), at a
node another region took, or at an op no row accepts (the note says why).

One activation spans several ops: quick_gelu, ``x * sigmoid(1.702 * x)`` (OpenAI
CLIP's, transformers' QuickGELUActivation), whose ``x`` has two users; it is
matched as a whole before the one-user rule applies. So is a gated linear unit
over interleaved gate / up columns (``glu_nodes``: the form gated_gemm.py writes),
right after the anchor; the epilogue ends there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx

from ..ir import note_not_fused, note_stops
from . import checks as C
from .checks import ACTIVATION_NAMES, EpilogueState
from .gated_gemm import BLOCK
from .graph_utils import aten, is_call, only_user, same_shape, val


@dataclass(frozen=True)
class Stage:
    name: str                 # which GemmEpilogue field it fills
    targets: tuple
    check: Callable           # (EpilogueState, node) -> str | None (reason to refuse)


EPILOGUE_STAGES = (
    Stage("bias", (aten.add.Tensor,),
          C.all_of(C.no_bias_yet, C.bias_before_activation, C.before_residual("a bias"),
                   C.alpha_is_one, C.other_is_column_vector, C.other_same_dtype)),
    Stage("activation", tuple(ACTIVATION_NAMES),
          C.all_of(C.no_activation_yet, C.before_residual("an activation"))),
    Stage("residual", (aten.add.Tensor, aten.mul.Tensor),
          C.all_of(C.no_residual_yet, C.kernel_takes_residual, C.alpha_is_one,
                   C.other_is_full_shape, C.other_same_dtype, C.other_independent_of_gemm)),
    Stage("post_activation", (aten.relu.default,),
          C.all_of(C.has_residual, C.no_post_activation_yet)),
)


def grow_epilogue(anchor: fx.Node, ops, taken) -> EpilogueState:
    state = EpilogueState(anchor=anchor, operands=ops, out=anchor, nodes=[anchor],
                          bias=ops.bias is not None, c=ops.c,
                          residual="add" if ops.c is not None else "none")
    notes = []
    glu = glu_nodes(anchor)
    if glu is not None and not any(n in taken for n in glu):
        state.glu = True
        state.activation = ACTIVATION_NAMES[glu[3].target](glu[3])
        state.nodes += glu
        state.out = glu[-1]
        state.notes = notes
        return state
    while True:
        quick = quick_gelu_nodes(state.out)
        if quick is not None and not any(n in taken for n in quick):
            refusal = _STAGES["activation"].check(state, quick[-1])
            if refusal is None:
                state.activation = "quick_gelu"
                state.nodes += quick
                state.out = quick[-1]
                continue
            notes.append(note_not_fused(quick[-1].name, f"as activation: {refusal}"))
            break
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


_STAGES = {stage.name: stage for stage in EPILOGUE_STAGES}
QUICK_GELU_SCALE = 1.702


def quick_gelu_nodes(x: fx.Node):
    """[scale, sigmoid, mul] when ``x``'s users are exactly ``x * sigmoid(1.702 * x)``
    (either operand order, the scale a number), each intermediate used once; else None."""
    users = list(x.users)
    if len(users) != 2:
        return None
    for scale in users:
        if not is_call(scale, aten.mul.Tensor, aten.mul.Scalar) or len(scale.args) != 2 or x not in scale.args:
            continue
        factor = scale.args[1] if scale.args[0] is x else scale.args[0]
        if (isinstance(factor, bool) or not isinstance(factor, (int, float))
                or not math.isclose(factor, QUICK_GELU_SCALE, rel_tol=1e-6)):
            continue
        sig = only_user(scale)
        mul = only_user(sig) if is_call(sig, aten.sigmoid.default) else None
        if is_call(mul, aten.mul.Tensor) and mul in users and set(mul.args) == {x, sig}:
            return [scale, sig, mul]
    return None


def glu_nodes(y: fx.Node):
    """[unflatten, select 0, select 1, act, mul, flatten] when ``y``'s only use is
    ``flatten(act(v[..., 0, :]) * v[..., 1, :], -2, -1)`` with ``v = y.unflatten(-1,
    (N / 16, 2, 8))`` (N = y's last dim; columns interleaved in blocks of 8 as
    gated_gemm.py writes them), ``act`` one op of the activation table, each
    intermediate used once (the selects by the activation and the product); else None."""
    un = only_user(y)
    yv = val(y)
    if not is_call(un, aten.unflatten.int) or not isinstance(yv, torch.Tensor) or yv.dim() < 1:
        return None
    n = yv.shape[-1]
    if len(un.args) != 3 or un.args[1] not in (-1, yv.dim() - 1) or list(un.args[2]) != [n // (2 * BLOCK), 2, BLOCK] \
            or not isinstance(n, int) or n % (2 * BLOCK):
        return None
    rank = yv.dim() + 2
    sels = {}
    for s in un.users:
        if not is_call(s, aten.select.int) or len(s.args) != 3 or s.args[1] not in (-2, rank - 2) \
                or s.args[2] not in (0, 1) or s.args[2] in sels:
            return None
        sels[s.args[2]] = s
    if len(un.users) != 2 or len(sels) != 2:
        return None
    act, mul = only_user(sels[0]), only_user(sels[1])
    if act is None or act.target not in ACTIVATION_NAMES or not act.args or act.args[0] is not sels[0]:
        return None
    if not is_call(mul, aten.mul.Tensor) or only_user(act) is not mul or set(mul.args) != {act, sels[1]} \
            or len(mul.args) != 2:
        return None
    out = only_user(mul)
    if not is_call(out, aten.flatten.using_ints) or tuple(out.args[1:]) not in ((-2, -1), (rank - 3, rank - 2)):
        return None
    return [un, sels[0], sels[1], act, mul, out]


def _match_stage(state, node):
    refusals = []
    for stage in EPILOGUE_STAGES:
        if node.target not in stage.targets:
            continue
        r = stage.check(state, node)
        if r is None:
            return stage, None
        label = stage.name
        if label == "residual":          # the residual stage adds or multiplies
            label = "residual multiply" if "mul" in str(node.target) else "residual add"
        refusals.append(f"as {label}: {r}")
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
        state.residual_per_sample = (state.residual_broadcast
                                     and not C.is_channel_vector(state, other)
                                     and C.is_sample_channel_tensor(state, other))
        state.c = other
    elif stage.name == "post_activation":
        state.post_activation = "relu"
    state.out = node
    state.nodes.append(node)
