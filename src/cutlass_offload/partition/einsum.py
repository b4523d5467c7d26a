"""Two-operand einsums as the batched GEMM ATen runs them, so they partition (and fuse)
like a written ``bmm``.

torch.export keeps ``aten.einsum`` whole (a composite op), and no row of the pattern
table anchors on it. ATen's own einsum (CompositeImplicitAutograd) contracts two
operands as permutes and reshapes into one ``bmm`` and a reshape and permute back
(``sumproduct_pair``). A batched-matmul einsum (one row, one column, one contracted
index, the rest batch) becomes ``matmul`` on permuted views instead (``_matmul_form``:
any dynamic size kept, and attention written with einsums reaches the attention
matcher); for the others, tracing that decomposition on the node's sizes
(``make_fx`` on meta tensors with the operands' strides) and splicing it in place of
the node gives the same arithmetic as a graph the partitioner reads: attention
written as ``einsum("bhqd,bhkd->bhqk", q, k)`` becomes a bmm whose B is k read
column-major, in place. The views of the decomposition are spliced as ``reshape``
(a view where the strides allow, else a copy: what einsum itself does), so a call
with other strides than the example's stays correct.

A one-operand einsum that only reorders dims (diffusers' unpatchify,
``einsum("nhwpqc->nchpwq", x)``) becomes that ``permute``: no arithmetic, nothing to
report.

Left as they are (the report lists them among the fallbacks): other einsums of one
operand, einsums of three and more, an explicit contraction path, operands of two dtypes,
ones other than the matmul form whose sizes are dynamic (the traced reshapes would
fix them), and a
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
        if not is_call(n, aten.einsum.default):
            continue
        if (perms := _matmul_form(n)) is not None:
            _splice_matmul(graph, n, perms)
            changed = True
            continue
        if (perm := _permutation(n)) is not None:       # no arithmetic: a permute
            with graph.inserting_before(n):
                out = _call(graph, aten.permute.default, (n.args[1][0], perm))
            n.replace_all_uses_with(out)
            graph.erase_node(n)
            changed = True
            continue
        if (sub := _decomposition(n)) is None:
            n.meta[REFUSAL_KEY] = _refusal(n)
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


# node.meta key: why an einsum left in the graph was not lowered (partition/unanchored.py
# reports it)
REFUSAL_KEY = "cutlass_offload_einsum_refusal"


def _refusal(n) -> str:
    """Why einsum node ``n`` is neither the matmul form, a permutation, nor a traced
    two-operand decomposition: the one cause that applies."""
    equation, operands = n.args[0], n.args[1]
    if len(n.args) > 2 and n.args[2] is not None or n.kwargs.get("path") is not None:
        return "an explicit contraction path is given"
    count = len(operands) if isinstance(operands, (list, tuple)) else 0
    if count == 1:
        return "one operand, and not a pure reordering of its dims"
    if count != 2:
        return f"{count} operands: only two-operand einsums are lowered"
    vals = [val(o) for o in operands]
    if not all(isinstance(v, torch.Tensor) and v.is_floating_point() for v in vals):
        return "an operand that is not a floating tensor"
    if vals[0].dtype != vals[1].dtype:
        return f"operands of two dtypes ({vals[0].dtype}, {vals[1].dtype})"
    lhs, _, out = str(equation).replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) == 2:
        a, b = terms
        rows = [c for c in a if c not in b and c in out]
        cols = [c for c in b if c not in a and c in out]
        dynamic = [c for t, v in zip(terms, vals) for c, d in zip(t, v.shape) if not isinstance(d, int)]
        if dynamic and (len(rows) != 1 or len(cols) != 1):
            return (f"'{equation}' has {len(rows)} row and {len(cols)} column indices and the "
                    f"dynamic size at index {', '.join(repr(c) for c in sorted(set(dynamic)))}: only the batched-matmul form "
                    "(one row, one column, one contracted index, the rest batch) keeps a dynamic size; "
                    "with static sizes (no dynamic_batch) it is lowered")
    return f"'{equation}' contracts no index (an outer product or a sum): not a GEMM"


def _matmul_form(n) -> tuple | None:
    """(A's, B's and the output's permutations) when einsum node ``n`` is a batched
    matmul: every index once per term, one row index (A and the output), one column
    index (B and the output), one contracted index (A and B), the others in all three
    (batch); None otherwise. As ``matmul(A.permute(pa), B.permute(pb)).permute(po)`` it
    keeps any dynamic size, and attention written with einsums
    (``softmax(einsum("bhqd,bhkd->bhqk") * s)``, then ``einsum("bhqk,bhkd->bhqd")``)
    is the matmul form the attention matcher reads."""
    equation, operands = n.args[0], n.args[1]
    if not isinstance(equation, str) or not isinstance(operands, (list, tuple)) or len(operands) != 2:
        return None
    lhs, arrow, out = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    vals = [val(o) for o in operands]
    if (not arrow or "." in equation or len(terms) != 2 or n.kwargs.get("path") is not None
            or not all(isinstance(v, torch.Tensor) for v in vals)
            or any(len(t) != v.dim() or len(set(t)) != len(t) for t, v in zip(terms, vals))
            or len(set(out)) != len(out)):
        return None
    a, b = terms
    batch = [c for c in out if c in a and c in b]
    rows, cols = [c for c in a if c not in b], [c for c in b if c not in a]
    red = [c for c in a if c in b and c not in out]
    if (len(rows) != 1 or len(cols) != 1 or len(red) != 1 or set(out) != set(batch + rows + cols)
            or set(a) != set(batch + rows + red) or set(b) != set(batch + red + cols)):
        return None
    order = batch + rows + cols
    return ([a.index(c) for c in batch + rows + red], [b.index(c) for c in batch + red + cols],
            [order.index(c) for c in out])


def _permutation(n) -> list | None:
    """The dims' order when einsum node ``n`` only reorders one operand's dims
    (diffusers' unpatchify, ``einsum("nhwpqc->nchpwq", x)``): one term, each index
    once, the output a reordering of it; None otherwise."""
    equation, operands = n.args[0], n.args[1]
    if not isinstance(equation, str) or not isinstance(operands, (list, tuple)) or len(operands) != 1:
        return None
    term, arrow, out = equation.replace(" ", "").partition("->")
    v = val(operands[0])
    if (not arrow or "." in equation or not isinstance(v, torch.Tensor) or len(term) != v.dim()
            or len(set(term)) != len(term) or sorted(out) != sorted(term)):
        return None
    return [term.index(c) for c in out]


def _splice_matmul(graph: fx.Graph, n, perms) -> None:
    """Replace einsum node ``n`` by its matmul form (``_matmul_form``)."""
    def permuted(x, perm):
        return x if perm == sorted(perm) else _call(graph, aten.permute.default, (x, perm))
    pa, pb, po = perms
    with graph.inserting_before(n):
        a, b = n.args[1]
        out = permuted(_call(graph, aten.matmul.default, (permuted(a, pa), permuted(b, pb))), po)
    n.replace_all_uses_with(out)
    graph.erase_node(n)


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
