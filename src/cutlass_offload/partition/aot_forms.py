"""AOTAutograd's forms of ops the partitioner anchors on, as torch.export gives them.

Under torch.compile (backend.py) the partitioner sees AOTAutograd's graph, where
composite ops have already been decomposed by the dispatcher:

* ``scaled_dot_product_attention`` became a backend-specific op
  (``_scaled_dot_product_flash_attention``, ``..._efficient_attention``,
  ``..._cudnn_attention``, ``..._flash_attention_for_cpu``) whose first output is
  the attention;
* ``group_norm`` became ``native_group_norm`` (first output: the result).

``to_composite`` rewrites each such op whose only use is its first output (no
dropout, inputs not padded by the dispatcher) back to the composite call the
partitioner knows; ``restore`` puts the original op back wherever the rewritten
node was not offloaded, so Inductor compiles what AOTAutograd chose. Everything
else keeps AOTAutograd's form: ``linear`` is ``permute + addmm`` (the GEMM
anchors take it), ``layer_norm`` is ``native_layer_norm`` (an anchor).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch.fx as fx
from torch.fx.operator_schemas import normalize_function

from .graph_utils import aten

# op -> the name of its mask / bias argument (None: it takes none)
_SDPA_OPS = {}
for _name, _mask in (("_scaled_dot_product_flash_attention", None),
                     ("_scaled_dot_product_efficient_attention", "attn_bias"),
                     ("_scaled_dot_product_cudnn_attention", "attn_bias"),
                     ("_scaled_dot_product_flash_attention_for_cpu", "attn_mask")):
    _packet = getattr(aten, _name, None)
    if _packet is not None:
        _SDPA_OPS[_packet.default] = _mask


@dataclass
class Rewrite:
    """One op put back in composite form: ``node`` (the composite call) replaces
    ``getitem(original(*args, **kwargs), 0)``; ``metas`` are the original and the
    getitem's meta dicts."""

    node: fx.Node
    target: object
    args: tuple
    kwargs: dict
    metas: tuple


def _only_first_output_used(n: fx.Node):
    """The getitem(n, 0) that is n's only user, or None."""
    users = list(n.users)
    if len(users) != 1:
        return None
    g = users[0]
    if g.op == "call_function" and g.target is operator.getitem and g.args[1] == 0:
        return g
    return None


def _bound(n: fx.Node) -> dict | None:
    got = normalize_function(n.target, n.args, n.kwargs, normalize_to_only_use_kwargs=True)
    return None if got is None else dict(got.kwargs)


def _composite(n: fx.Node):
    """(target, args, kwargs) of the composite call that ``n`` came from, or None."""
    a = _bound(n)
    if a is None:
        return None
    if n.target in _SDPA_OPS:
        if a.get("dropout_p", 0.0) != 0.0:
            return None
        mask_arg = _SDPA_OPS[n.target]
        mask = a.get(mask_arg) if mask_arg else None
        return (aten.scaled_dot_product_attention.default, (a["query"], a["key"], a["value"]),
                {"attn_mask": mask, "dropout_p": 0.0, "is_causal": bool(a.get("is_causal", False)),
                 "scale": a.get("scale")})
    if n.target is aten.native_group_norm.default:
        return (aten.group_norm.default, (a["input"], a["group"], a.get("weight"), a.get("bias"),
                                          a["eps"]), {})
    return None


def to_composite(gm: fx.GraphModule) -> list:
    """Rewrite the AOT forms above in ``gm`` (in place); returns the Rewrites for
    ``restore``."""
    graph, done = gm.graph, []
    for n in list(graph.nodes):
        if n.op != "call_function" or (n.target not in _SDPA_OPS and n.target is not aten.native_group_norm.default):
            continue
        first = _only_first_output_used(n)
        call = _composite(n) if first is not None else None
        if call is None:
            continue
        target, args, kwargs = call
        with graph.inserting_before(n):
            new = graph.call_function(target, args, kwargs)
        new.meta = dict(first.meta)
        first.replace_all_uses_with(new)
        done.append(Rewrite(new, n.target, n.args, dict(n.kwargs), (dict(n.meta), dict(first.meta))))
        graph.erase_node(first)
        graph.erase_node(n)
    if done:
        gm.recompile()
    return done


def restore(gm: fx.GraphModule, rewrites: list) -> int:
    """Put the original op back for each rewritten node still in ``gm`` (not taken
    into a region). Returns how many were restored."""
    graph = gm.graph
    alive = set(graph.nodes)
    count = 0
    for r in rewrites:
        if r.node not in alive or not _args_alive(r, alive):
            continue
        with graph.inserting_before(r.node):
            orig = graph.call_function(r.target, r.args, r.kwargs)
            first = graph.call_function(operator.getitem, (orig, 0))
        orig.meta, first.meta = dict(r.metas[0]), dict(r.metas[1])
        r.node.replace_all_uses_with(first)
        graph.erase_node(r.node)
        count += 1
    if count:
        gm.recompile()
    return count


def _args_alive(r: Rewrite, alive) -> bool:
    nodes = []
    fx.node.map_arg((r.args, r.kwargs), nodes.append)
    return all(a in alive for a in nodes)


def op_counts(rewrites: list) -> dict:
    """{original op name: how many were rewritten} (for the report)."""
    out = {}
    for r in rewrites:
        name = getattr(r.target, "__name__", str(r.target)).split(".")[0]
        out[name] = out.get(name, 0) + 1
    return out
