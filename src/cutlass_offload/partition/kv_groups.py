"""Grouped-query attention with K and V read in place.

A model with fewer K/V heads than query heads either hands SDPA its K and V as they are
(``enable_gqa=True``) or repeats them per query head first, as transformers'
``repeat_kv`` does::

    k[:, :, None, :, :].expand(B, Hkv, G, S, D).reshape(B, Hkv * G, S, D)

(in the exported graph: ``unsqueeze(k, 2)``, ``expand``, ``reshape``: a copy of K, G
times its size, and the same of V, per layer). Where both K's and V's copies are read
by the attention alone, the region reads the un-repeated K and V instead and the
kernel maps query head h to K/V head h // G (``AttentionProblem.kv_group``); the
repeat's nodes join the region, so the copies are not made (the region's PyTorch
fallback still runs them).
"""
from __future__ import annotations

import torch.fx as fx

from .graph_utils import aten, is_call, same_dim, static_int, val

# False: a grouped-query attention runs on K and V as the model repeats them (one K/V
# head per query head, as before kv_group existed), and SDPA's enable_gqa stays in
# PyTorch (a switch for A/B runs, benchmarks/gqa_attention.py). On since
# tests/gpu/test_gqa_attention_gpu.py passed on an H100 (session 56: both kernels,
# fp16 / bf16, causal or not, transformers' Llama).
GQA_IN_PLACE: bool = True

_RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)


def repeated_heads(node: fx.Node):
    """(source, G, chain) when ``node`` is ``source`` (B, Hkv, S, D) with every head
    repeated G > 1 times in a row (B, Hkv * G, S, D) by unsqueeze / expand / reshape
    (a contiguous clone between the last two allowed), each intermediate used only by
    the next; ``chain`` lists those nodes, ``node`` first. None otherwise."""
    if not is_call(node, *_RESHAPES):
        return None
    chain, e = [node], node.args[0]
    if is_call(e, aten.clone.default) and len(e.args) == 1:
        chain.append(e)
        e = e.args[0]
    if not is_call(e, aten.expand.default):
        return None
    chain.append(e)
    u = e.args[0]
    if not (is_call(u, aten.unsqueeze.default) and len(u.args) == 2 and u.args[1] in (2, -3)):
        return None
    chain.append(u)
    src = u.args[0]
    sv, ev, rv = val(src), val(e), val(node)
    if any(getattr(t, "dim", lambda: 0)() != d for t, d in ((sv, 4), (ev, 5), (rv, 4))):
        return None
    hkv, g = static_int(ev.shape[1]), static_int(ev.shape[2])
    if hkv is None or g is None or g < 2 or static_int(sv.shape[1]) != hkv \
            or static_int(rv.shape[1]) != hkv * g:
        return None
    for a, b in ((rv.shape[0], sv.shape[0]), (rv.shape[2], sv.shape[2]), (rv.shape[3], sv.shape[3]),
                 (ev.shape[0], sv.shape[0]), (ev.shape[3], sv.shape[2]), (ev.shape[4], sv.shape[3])):
        if not same_dim(a, b):
            return None
    for inner, outer in zip(chain[1:], chain):
        if set(inner.users) != {outer}:
            return None
    return src, g, chain


def read_in_place(ops) -> None:
    """Point ``ops`` (partition/attention.py's AttentionOperands) at the un-repeated K
    and V when both are ``repeated_heads`` with one G and read by the attention alone:
    sets ``ops.k``, ``ops.v``, ``ops.kv_group``, adds the repeats' nodes to the region."""
    if not GQA_IN_PLACE or ops.k_transposed or ops.kv_group != 1 or ops.k is ops.v:
        return
    rk, rv = repeated_heads(ops.k), repeated_heads(ops.v)
    if rk is None or rv is None or rk[1] != rv[1]:
        return
    members = set(ops.nodes)
    if not (set(ops.k.users) <= members and set(ops.v.users) <= members):
        return
    ops.k, ops.v, ops.kv_group = rk[0], rv[0], rk[1]
    ops.nodes.extend(rk[2] + rv[2])
    ops.notes.append(f"grouped-query attention: K and V read in place, {rk[1]} query heads per "
                     "K/V head (the model's repeat_kv copies are not made)")
