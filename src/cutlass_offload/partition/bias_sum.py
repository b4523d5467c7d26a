"""Two additive biases on attention logits added to each other first (a canonicalize
rewrite), so the attention matcher sees one.

BLOOM adds its ALiBi bias and then the attention mask it is given (padding and
causal, built from ``attention_mask`` at run time) to the logits::

    s = q @ k^T * scale + alibi              # alibi (B, H, 1, S)
    p = softmax(s + mask)                   # mask  (B, 1, L, S)

The attention kernels add one bias, and fold a second only when it is a compile-time
causal mask (partition/attention_forms.py), so with a mask passed in this stayed two
GEMMs and a softmax. Regrouped::

    p = softmax(q @ k^T * scale + (alibi + mask))

is the same sum (rounded differently: PyTorch rounds the logits after each add, here
the biases are added in their dtype and the kernel adds the sum in fp32). The sum is
materialized per call by the glue, one tensor of the logits' shape (broadcast
dims kept) where the unfused form writes the logits twice. Rewritten only when both
biases depend on a graph input (a compile-time one may be a causal mask the
matcher folds), neither leads back to a matmul, and a softmax follows.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .attention import _reaches_matmul
from .constants import constant_value
from .graph_utils import aten, fake_value, is_call, same_shape, users, val
from .window_bias import _tensor_add

_SOFTMAX = (aten._softmax.default, aten.softmax.int)
META_KEY = "co_bias_sum"          # on the summed bias node: the matcher notes it
NOTE = ("its bias is two biases of the logits (e.g. ALiBi and the attention mask) added to "
        "each other in the glue first (partition/bias_sum.py)")
_CASTS = (aten.to.dtype, aten._to_copy.default)


def _from_matmul(n) -> bool:
    """n carries logits: the attention matcher's walk leads it back to a matmul."""
    return _reaches_matmul(n, 12)


def _bias(n) -> bool:
    """A tensor added to the logits that is not itself logits and not compile-time."""
    v = val(n)
    return (isinstance(v, torch.Tensor) and v.dim() >= 2 and not _from_matmul(n)
            and constant_value(n) is None)


def merge_logit_biases(graph: fx.Graph) -> int:
    """Rewrite every ``softmax((x + b1) + b2)`` (x logits, b1, b2 biases as in the module
    docstring; a cast may sit before the softmax) to ``softmax(x + (b1 + b2))``;
    returns how many. New nodes get their ``meta['val']``."""
    done = 0
    for sm in list(graph.nodes):
        if not is_call(sm, *_SOFTMAX):
            continue
        outer = sm.args[0]
        if is_call(outer, *_CASTS) and len(outer.users) == 1:
            outer = outer.args[0]
        pair = _tensor_add(outer)
        if pair is None or len(outer.users) != 1:
            continue
        inner, b2 = (pair if _tensor_add(pair[0]) is not None and _from_matmul(pair[0])
                     else pair[::-1])
        inner_pair = _tensor_add(inner)
        if inner_pair is None or users(inner) != [outer] or len(inner.users) != 1:
            continue
        x, b1 = inner_pair if _from_matmul(inner_pair[0]) else inner_pair[::-1]
        if not (_from_matmul(x) and _bias(b1) and _bias(b2)):
            continue
        summed = fake_value(aten.add.Tensor, (b1, b2))
        if summed is None or summed.dtype != val(x).dtype:
            continue
        try:                                     # the sum must not widen the logits
            wide = torch.broadcast_shapes(summed.shape, val(x).shape)
        except RuntimeError:
            continue
        if not same_shape(wide, val(x).shape):
            continue
        with graph.inserting_before(outer):
            bias = graph.call_function(aten.add.Tensor, (b1, b2))
            bias.meta["val"] = summed
            bias.meta[META_KEY] = True
            logits = graph.call_function(aten.add.Tensor, (x, bias))
            logits.meta.update(outer.meta)
        outer.replace_all_uses_with(logits)
        graph.erase_node(outer)
        graph.erase_node(inner)
        done += 1
    return done
