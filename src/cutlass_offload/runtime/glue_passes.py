"""Rewrites of the glue graph before Inductor compiles it (runtime/glue.py).

Attention left to PyTorch (the measured-faster list sends some to SDPA) often
arrives as Hugging Face writes it::

    q = (self.q_proj(x) * self.scaling).view(B, L, H, D).transpose(1, 2).contiguous()
    k = self.k_proj(x).view(B, L, H, D).transpose(1, 2).contiguous()
    ...
    o = F.scaled_dot_product_attention(q, k, v, scale=1.0)
    o = o.transpose(1, 2).contiguous().reshape(B, L, H * D)

Each ``.contiguous()`` is a copy kernel (whisper-encoder: three per layer before
SDPA, and the head merge after it, 4-8 us each on the H200: session 27's profile),
and q's scale is one more pass over q. Neither changes SDPA's result: its fused
kernels read any layout whose last dim is dense (PyTorch's sdp_utils:
``check_last_dim_stride_equals_1``; Inductor's ``sdpa_constraint`` copies an input
itself where a kernel needs more), and a constant factor on q is a factor on the
scores. So:

* ``drop_sdpa_input_copies``: a layout-only copy (layout_copies.py) of a 4-D tensor
  whose every use is the query, key or value of an SDPA call is replaced by its
  input. SDPA's output then takes the input's layout (cuDNN's and
  the meta function's ``alloc_with_matching_layout``: B, L, H, D in memory), so the
  head merge's ``transpose(1, 2).contiguous()`` is a no-op when Inductor traces it.
* ``fold_sdpa_query_scale``: ``sdpa(views(q * c), ..., scale=s)`` becomes
  ``sdpa(views(q), ..., scale=c * s)`` (s defaults to 1 / sqrt(E), E = q.size(-1):
  the formula of torch.nn.functional.scaled_dot_product_attention's docs) when the
  product and each view between it and SDPA have no other use (q is not also k or
  v) and c > 0. The scale is then
  applied in the kernel in float32 instead of rounding q * c to q's dtype (exact
  for a power of two such as whisper's 0.125).

Both rewrite the graph in place, touch nothing else, and return how many nodes they
changed. Semantics: the graph is functional (torch.export's ATen graph), so no op
can observe that a value stopped being a fresh copy.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from ..layout_copies import is_layout_copy

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default
# ops whose result only re-labels the same elements (shape / stride changes)
VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.transpose.int,
         aten.permute.default, aten.unsqueeze.default, aten.squeeze.dim, aten.expand.default}
SCALES = {aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar}


def _val(node):
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _qkv_only(node: fx.Node) -> bool:
    """Every use of ``node`` is an SDPA call's query, key or value argument."""
    for user in node.users:
        if user.target is not SDPA or node in user.kwargs.values():
            return False
        if any(a is node for a in user.args[3:]):
            return False
    return bool(node.users)


def drop_sdpa_input_copies(gm: fx.GraphModule) -> int:
    """Replace each layout copy that feeds only SDPA's q / k / v with its input
    (module docstring). Returns the number of copies removed."""
    removed = 0
    for node in list(gm.graph.nodes):
        if not is_layout_copy(node, ranks=(4,)) or not _qkv_only(node):
            continue
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
        removed += 1
    if removed:
        gm.recompile()
    return removed


def _constant_factor(node: fx.Node) -> float | None:
    """c when ``node`` is x * c or x / c with c a Python number, x of node's dtype."""
    if node.op != "call_function" or node.target not in SCALES or node.kwargs or len(node.args) != 2:
        return None
    x, c = node.args
    if not isinstance(x, fx.Node) or isinstance(c, bool) or not isinstance(c, (int, float)):
        return None
    xv, out = _val(x), _val(node)
    if xv is None or out is None or xv.dtype != out.dtype or not out.dtype.is_floating_point:
        return None
    if node.target in (aten.div.Tensor, aten.div.Scalar):
        return 1.0 / c if c else None
    return float(c)


def fold_sdpa_query_scale(gm: fx.GraphModule, through_copies: bool = False) -> int:
    """Move a constant factor on SDPA's query into its ``scale`` (module docstring);
    ``through_copies``: the walk back from q also passes single-use layout-only copies
    (partition's canonicalize, where the copies are still there: the attention region
    reads through them). Returns the number of SDPA calls changed."""
    changed = 0
    for sdpa in list(gm.graph.nodes):
        if sdpa.target is not SDPA or not sdpa.args or not isinstance(sdpa.args[0], fx.Node):
            continue
        q = _val(sdpa.args[0])
        if q is None or not isinstance(q.size(-1), int):
            continue
        if sdpa.args[0] in sdpa.args[1:] or sdpa.args[0] in sdpa.kwargs.values():
            continue                # q is also k or v: its factor is not q's alone
        # walk from q back through single-use views to the product
        first, node = None, sdpa.args[0]
        while (node.op == "call_function" and len(node.users) == 1 and isinstance(node.args[0], fx.Node)
               and (node.target in VIEWS or (through_copies and is_layout_copy(node)))):
            first, node = node, node.args[0]
        if len(node.users) != 1:
            continue
        c = _constant_factor(node)
        if c is None or not math.isfinite(c) or c <= 0:
            continue
        scale = sdpa.kwargs.get("scale")
        if scale is None:
            scale = 1.0 / math.sqrt(q.size(-1))
        if not isinstance(scale, (int, float)):
            continue
        x = node.args[0]
        if first is None:
            sdpa.replace_input_with(node, x)
        else:
            first.replace_input_with(node, x)
        sdpa.kwargs = {**sdpa.kwargs, "scale": float(scale) * c}
        gm.graph.erase_node(node)
        changed += 1
    if changed:
        gm.recompile()
    return changed


def rewrite_for_sdpa(gm: fx.GraphModule) -> dict:
    """Both rewrites, the copies first (a query's factor sits behind its copy; the
    fold walks through views only). Returns {"sdpa_input_copies_dropped": n,
    "sdpa_scales_folded": m}."""
    dropped = drop_sdpa_input_copies(gm)
    return {"sdpa_input_copies_dropped": dropped, "sdpa_scales_folded": fold_sdpa_query_scale(gm)}
