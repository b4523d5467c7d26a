"""Layout-only copies: ``contiguous()``, or ``clone()`` to the contiguous or the
input's own memory format, of a tensor whose last dim is dense. Such a copy changes
strides only, so an op that reads any batch / seq / head strides can take its input
instead: partition/attention_forms.py lets the copy join the attention region (our
kernel reads the view in place) and runtime/glue_passes.py drops it before SDPA in
the glue. Hugging Face's head split, ``.transpose(1, 2).contiguous()``, is one.
This module depends on torch only: partition/ and runtime/ both use it.
"""
from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten
COPIES = (aten.contiguous.default, aten.clone.default)
FORMATS = (None, torch.contiguous_format, torch.preserve_format)


def _static(x):
    """x as an int when it is static (an int, or a SymInt of a constant), else None."""
    if isinstance(x, int):
        return x
    try:
        return int(x) if x.node.is_constant() else None
    except AttributeError:
        return None


def is_layout_copy(node, ranks=(3, 4)) -> bool:
    """Whether ``node`` is a layout-only copy (module docstring) of a tensor of one of
    ``ranks`` whose recorded value (``meta["val"]``) has a last dim of stride 1 or
    of size 1."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target in COPIES
            and len(node.args) == 1 and isinstance(node.args[0], fx.Node)
            and set(node.kwargs) <= {"memory_format"} and node.kwargs.get("memory_format") in FORMATS):
        return False
    v = node.args[0].meta.get("val")
    return (isinstance(v, torch.Tensor) and v.dim() in ranks
            and (_static(v.stride(-1)) == 1 or _static(v.size(-1)) == 1))
