"""A per-head logit scale moved onto q (a canonicalize rewrite), so attention with one
reads as the attention matcher's form.

Swin-V2's cosine attention (torchvision ``ShiftedWindowAttentionV2``, transformers
``Swinv2SelfAttention``) multiplies the logits by a learned scale per head::

    attn = normalize(q) @ normalize(k).transpose(-2, -1)     # (B, H, L, S)
    attn = attn * logit_scale.clamp(max=log(100)).exp()     # (H, 1, 1)
    attn = softmax(attn + relative_position_bias [+ mask])

The attention kernels take one scalar scale, so this stayed two GEMMs and a softmax.
A factor constant over the last two dims scales each row of q alike, so::

    attn = (normalize(q) * s) @ normalize(k).transpose(-2, -1)

is the same product (rounded once more: q * s is rounded to q's dtype before the
GEMM, where the logits were rounded after it). Rewritten only where the factor is a
tensor of the logits' dtype whose last two dims are 1, the matmul's output has no
other user, and a softmax over the last dim follows within a few elementwise ops.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .graph_utils import aten, fake_value, is_call, same_shape, static_int, users, val

_SOFTMAX = (aten._softmax.default, aten.softmax.int)
_ON_THE_WAY = (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor,
               aten.masked_fill.Scalar, aten.to.dtype, aten._to_copy.default,
               aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def _softmax_follows(n: fx.Node, steps: int = 6) -> bool:
    for _ in range(steps):
        nxt = users(n)
        if len(nxt) != 1:
            return False
        n = nxt[0]
        if is_call(n, *_SOFTMAX):
            return True
        if not is_call(n, *_ON_THE_WAY):
            return False
    return False


def _head_factor(mul: fx.Node, mm: fx.Node):
    """The other operand of ``mul`` when it is a per-head factor of ``mm``'s logits."""
    if len(mul.args) != 2 or mul.kwargs:
        return None
    t = mul.args[1] if mul.args[0] is mm else mul.args[0]
    tv, mv = val(t) if isinstance(t, fx.Node) else None, val(mm)
    if not isinstance(tv, torch.Tensor) or not isinstance(mv, torch.Tensor) or t is mm:
        return None
    if tv.dtype != mv.dtype or tv.dim() < 2 or tv.dim() > mv.dim():
        return None
    if [static_int(d) for d in tv.shape[-2:]] != [1, 1] or not same_shape(val(mul).shape, mv.shape):
        return None
    return t


def fold_head_scale_into_q(graph: fx.Graph) -> int:
    """Rewrite every ``matmul(q, kT) * s`` (module docstring) to ``matmul(q * s, kT)``;
    returns how many. New nodes get their ``meta['val']``."""
    done = 0
    for mul in list(graph.nodes):
        if not is_call(mul, aten.mul.Tensor):
            continue
        mm = next((a for a in mul.args if is_call(a, aten.matmul.default)), None)
        if mm is None or users(mm) != [mul] or len(mm.users) != 1:
            continue
        t = _head_factor(mul, mm)
        q = mm.args[0]
        if t is None or not isinstance(q, fx.Node) or val(q).dtype != val(t).dtype \
                or not _softmax_follows(mul):
            continue
        with graph.inserting_before(mul):        # after s, which may come after the matmul
            qs = graph.call_function(aten.mul.Tensor, (q, t))
            qs.meta["val"] = fake_value(aten.mul.Tensor, (q, t))
            if qs.meta["val"] is None or not same_shape(qs.meta["val"].shape, val(q).shape):
                graph.erase_node(qs)           # t widens q's shape: not a per-row factor
                continue
            scaled = graph.call_function(aten.matmul.default, (qs, mm.args[1]))
            scaled.meta.update(mm.meta)
            scaled.meta["val"] = fake_value(aten.matmul.default, (qs, mm.args[1]))
        mul.replace_all_uses_with(scaled)
        graph.erase_node(mul)
        graph.erase_node(mm)
        done += 1
    return done
