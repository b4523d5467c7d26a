"""Swin's windowed attention mask as one bias of the logits (a canonicalize rewrite).

Swin (microsoft/Swin-Transformer ``WindowAttention``, torchvision's
``shifted_window_attention``) adds its shift mask to the logits of all windows by
splitting the batch of windows in two around the add:

    attn = q @ k.transpose(-2, -1)              # (B * nW, H, N, N)
    attn = attn + relative_position_bias        # (1, H, N, N)
    attn = attn.view(B, nW, H, N, N) + mask.unsqueeze(1).unsqueeze(0)   # (1, nW, 1, N, N)
    attn = attn.view(-1, H, N, N)
    attn = softmax(attn, -1)

The attention matcher takes one additive bias on the logits and no views between
q @ k^T and the softmax, so this stayed two batched GEMMs and a softmax. Here the
adds are regrouped so the logits get one bias of their own shape:

    bias = (relative_position_bias.expand(B * nW, H, N, N).reshape(B, nW, H, N, N)
            + mask.unsqueeze(1).unsqueeze(0)).reshape(B * nW, H, N, N)
    attn = softmax(q @ k.transpose(-2, -1) + bias, -1)

which is the same sum (the rounding differs: PyTorch rounds the logits after each
add, here the two biases are added first and the kernel adds the sum in fp32). The
bias is materialized per call in the glue (Inductor fuses its ops into one kernel),
one (B * nW, H, N, N) tensor where the unfused form writes three of the logits.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from .graph_utils import aten, fake_value, is_call, only_user, same_shape, val

_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_SOFTMAX = (aten._softmax.default, aten.softmax.int)


def _tensor_add(n):
    """(a, b) of ``a + b`` on two tensor nodes with no alpha, else None."""
    if not is_call(n, aten.add.Tensor) or len(n.args) != 2 or n.kwargs.get("alpha", 1) != 1:
        return None
    a, b = n.args
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return None
    return a, b


def _batch_split(t1: fx.Node, t2: fx.Node) -> bool:
    """``t2`` views ``t1`` (rank r) as rank r + 1, splitting dim 0 and keeping the rest."""
    v1, v2 = val(t1), val(t2)
    return (isinstance(v1, torch.Tensor) and isinstance(v2, torch.Tensor)
            and v2.dim() == v1.dim() + 1 and same_shape(v2.shape[2:], v1.shape[1:]))


def _node(graph: fx.Graph, target, args) -> fx.Node:
    n = graph.call_function(target, args)
    # sizes may be SymInt nodes inside a list: their values, as the op takes them
    n.meta["val"] = fake_value(target, fx.node.map_arg(args, val))
    return n


def _static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def _resolved(split, shape):
    """The split view's sizes with a -1 worked out from the logits' static shape (the
    bias is expanded to them: expand keeps a -1 dim as it is); None when a -1 meets a
    dynamic size."""
    if -1 not in [d for d in split if isinstance(d, int)]:
        return split
    if not _static(shape) or not _static(split) or split.count(-1) != 1:
        return None
    missing = math.prod(shape) // -math.prod(split)      # the -1 makes the product negative
    return [missing if d == -1 else d for d in split]


def merge_window_bias(graph: fx.Graph) -> int:
    """Rewrite every ``view(view(x [+ b1], split) + b2, back) -> softmax`` (module
    docstring) into ``x + bias``; returns how many. Only where each intermediate has
    one user, the dtypes agree, the split view separates dim 0 (a -1 in it only
    with static sizes: the bias is expanded to them), the view back restores x's shape, and
    b1 is one bias for every window (its dim 0 broadcast) or one per window. Every
    new node gets its ``meta['val']``."""
    done = 0
    for t4 in list(graph.nodes):
        if not is_call(t4, *_VIEWS) or not is_call(only_user(t4), *_SOFTMAX):
            continue
        t3 = t4.args[0]
        added = _tensor_add(t3) if len(t3.users) == 1 else None
        if added is None:
            continue
        t2, b2 = added if is_call(added[0], *_VIEWS) else added[::-1]
        if not is_call(t2, *_VIEWS) or len(t2.users) != 1:
            continue
        x, full = t2.args[0], t4.args[1]
        if not isinstance(x, fx.Node) or not _batch_split(x, t2) or not same_shape(val(t4).shape, val(x).shape):
            continue
        dtype, shape = val(x).dtype, list(val(x).shape)
        split = _resolved(list(t2.args[1]), shape)
        if split is None:
            continue
        if val(b2).dtype != dtype:
            continue
        b1, t1 = None, None
        inner = _tensor_add(x) if len(x.users) == 1 else None
        if inner is not None:
            y, b = inner if same_shape(val(inner[0]).shape, shape) else inner[::-1]
            bv = val(b)
            b4 = [1] * (len(shape) - bv.dim()) + list(bv.shape)
            if (same_shape(val(y).shape, shape) and bv.dtype == dtype and _static(b4[1:])
                    and (b4[0] == 1 or same_shape(b4[:1], shape[:1]))):
                t1, x, b1 = x, y, b
        with graph.inserting_before(t4):
            windows = _node(graph, aten.expand.default, (b2, split))
            if b1 is not None:
                # one bias per window batch entry, or one for all (dim 0 broadcast)
                b1_5 = _node(graph, aten.reshape.default,
                             (b1, split if b4[0] != 1 else [1, 1] + b4[1:]))
                windows = _node(graph, aten.add.Tensor, (windows, b1_5))
            bias = _node(graph, aten.reshape.default, (windows, full))
            logits = _node(graph, aten.add.Tensor, (x, bias))
        t4.replace_all_uses_with(logits)
        for n in (t4, t3, t2, t1):
            if n is not None and not n.users:
                graph.erase_node(n)
        done += 1
    return done
