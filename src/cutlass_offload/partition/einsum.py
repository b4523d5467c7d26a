"""Two-operand einsums as the batched GEMM ATen runs them, so they partition (and fuse)
like a written ``bmm``.

torch.export keeps ``aten.einsum`` whole (a composite op), and no row of the pattern
table anchors on it. ATen's own einsum (CompositeImplicitAutograd) contracts two
operands as permutes and reshapes into one ``bmm`` and a reshape and permute back
(``sumproduct_pair``); tracing that decomposition on the node's sizes
(``make_fx`` on meta tensors with the operands' strides) and splicing it in place of
the node gives the same arithmetic as a graph the partitioner reads: attention
written as ``einsum("bhqd,bhkd->bhqk", q, k)`` becomes a bmm whose B is k read
column-major, in place. The views of the decomposition are spliced as ``reshape``
(a view where the strides allow, else a copy: what einsum itself does), so a call
with other strides than the example's stays correct.

Left as they are (the report lists them among the fallbacks): einsums of one
operand or of three and more, an explicit contraction path, operands whose sizes
are dynamic (the traced reshapes would fix them) or of two dtypes, and a
decomposition without exactly one ``bmm`` (an outer product is a broadcast multiply,
not a GEMM).
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from .graph_utils import aten, is_call, val
from .graph_utils import call_with_val as _call

# what ATen's two-operand einsum decomposes into (views, the contraction, and a sum
# over an index that only one operand holds)
_ALLOWED = {aten.permute.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
            aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.clone.default,
            aten.bmm.default, aten.sum.dim_IntList, aten.expand.default}
_AS_RESHAPE = {aten.view.default, aten._unsafe_view.default}


def einsum_as_bmm(gm: fx.GraphModule) -> bool:
    """Replace every lowerable einsum of ``gm`` (module docstring) by its decomposition,
    in place; True when something changed. ``meta['val']`` stays valid on every new
    node."""
    graph, changed = gm.graph, False
    for n in list(graph.nodes):
        if not is_call(n, aten.einsum.default) or (sub := _decomposition(n)) is None:
            continue
        inputs = iter(n.args[1])
        env = {}
        with graph.inserting_before(n):
            for s in sub.graph.nodes:
                if s.op == "placeholder":
                    env[s] = next(inputs)
                elif s.op == "call_function":
                    target = aten.reshape.default if s.target in _AS_RESHAPE else s.target
                    env[s] = _call(graph, target, fx.map_arg(s.args, env.__getitem__),
                                   fx.map_arg(s.kwargs, env.__getitem__))
                elif s.op == "output":
                    out = env[s.args[0]]
        n.replace_all_uses_with(out)
        graph.erase_node(n)
        changed = True
    if changed:
        graph.eliminate_dead_code()
    return changed


def _decomposition(n) -> fx.GraphModule | None:
    """ATen's decomposition of einsum node ``n`` traced on its operands' sizes, dtype
    and strides, or None when ``n`` is not lowered (module docstring)."""
    equation, operands = n.args[0], n.args[1]
    if len(n.args) > 2 and n.args[2] is not None or n.kwargs.get("path") is not None:
        return None
    if not isinstance(equation, str) or not isinstance(operands, (list, tuple)) or len(operands) != 2:
        return None
    vals = [val(o) for o in operands]
    if not all(isinstance(v, torch.Tensor) and v.is_floating_point() for v in vals):
        return None
    if vals[0].dtype != vals[1].dtype or not all(
            isinstance(s, int) for v in vals for s in (*v.shape, *v.stride())):
        return None
    metas = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta") for v in vals]
    try:
        sub = make_fx(lambda a, b: torch.einsum(equation, a, b))(*metas)
    except Exception:  # noqa: BLE001 - an equation ATen refuses stays as it is (and fails there)
        return None
    calls = [s for s in sub.graph.nodes if s.op == "call_function"]
    if sum(s.target is aten.bmm.default for s in calls) != 1 or any(s.target not in _ALLOWED for s in calls):
        return None
    return sub
