"""The compile-time value of a graph node computed from module constants and input
sizes only (a causal mask built in ``forward``, a batch norm's scale written out), for
the rewrites and matchers that fold such values into a kernel: attention_forms (masks
into the kernel's causal mode), canonicalize (per-channel factors into conv weights)."""
from __future__ import annotations

import math
import weakref

import torch
import torch.fx as fx

from .graph_utils import aten, hint_int, val

_MAX_FOLD_NODES = 512            # a value computed by more ops is not evaluated
_MAX_FOLD_ELEMENTS = 1 << 26
_FOLDS = weakref.WeakKeyDictionary()      # graph -> {node: (value, symbolic) | None}


# ops whose value is not a function of their arguments (uninitialized memory)
_UNINITIALIZED = ("empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided")


# in-place ops that change no value, only autograd state: evaluated out of place (a
# lifted tensor constant is ``lift_fresh_copy`` then ``detach_`` in transformers 5.17's
# masks; evaluating in place would detach a module's own parameter)
_OUT_OF_PLACE = {aten.detach_.default: aten.detach.default}


def _pure(target) -> bool:
    if target in _OUT_OF_PLACE:
        return True
    if isinstance(target, torch._ops.OpOverload):
        if target._schema.is_mutable or target.overloadpacket.__name__ in _UNINITIALIZED:
            return False
        return torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ())
    return getattr(target, "__module__", None) in ("_operator", "operator") or target is math.sqrt


def _attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def constant_value(node: fx.Node):
    """(tensor, symbolic) when ``node``'s value is computable from the graph's constants
    and input sizes (``symbolic``: it depends on dynamic sizes and was evaluated at
    the example sizes), else None."""
    graph = node.graph
    memo = _FOLDS.setdefault(graph, {})
    if node in memo:
        return memo[node]
    memo[node] = result = _evaluate(node)
    return result


def _evaluate(node):
    stack, anc, symbolic = [node], set(), False
    while stack:
        n = stack.pop()
        if n in anc:
            continue
        if n.op == "get_attr":
            anc.add(n)
            continue
        if n.op != "call_function":
            return None                           # a graph input: data-dependent
        if n.target is aten.sym_size.int:         # a size of an input: its example value
            anc.add(n)
            symbolic = True
            continue
        if not _pure(n.target):
            return None
        anc.add(n)
        if len(anc) > _MAX_FOLD_NODES:
            return None
        stack.extend(n.all_input_nodes)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    gm = node.graph.owning_module
    env = {}
    try:
        with torch.no_grad():
            for n in sorted(anc, key=order.__getitem__):
                if n.op == "get_attr":
                    env[n] = _attr(gm, n.target)
                elif n.target is aten.sym_size.int:
                    env[n] = hint_int(val(n), default=-1)
                    if env[n] < 0:
                        return None
                else:
                    args = fx.node.map_arg(n.args, env.__getitem__)
                    kwargs = fx.node.map_arg(n.kwargs, env.__getitem__)
                    env[n] = _OUT_OF_PLACE.get(n.target, n.target)(*args, **kwargs)
                    if isinstance(env[n], torch.Tensor) and env[n].numel() > _MAX_FOLD_ELEMENTS:
                        return None
    except Exception:                   # noqa: BLE001 (not evaluable: the mask is a bias)
        return None
    out = env[node]
    if not isinstance(out, torch.Tensor) or out.dim() < 1:
        return None
    return out, symbolic
