"""FLOPs of the graph's matmul-, conv- and attention-like ops at the example inputs'
sizes, so the report can say what share of that work was offloaded (issue 19's
measure: "100% of GEMM / conv / attention FLOPs").

One row per ATen op: which argument gives the reduction size. A multiply-add counts
as 2 FLOPs, as in ``torch.utils.flop_counter``: a GEMM or batched GEMM
2 * numel(out) * K; a convolution 2 * numel(out) * (C / groups) * prod(filter
window), i.e. 2 * numel(out) * numel(w) / K, a transposed one 2 * numel(x) * numel(w) /
C_in; an attention 2 * numel(out) / Dv * Lk *
(D + Dv) (q k^T, then p v); an einsum by its contractions (``_einsum``). Symbolic sizes count at their example value (the
capture's hint). An op whose sizes are not recorded counts 0. Norms are memory-bound
and not counted.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from .graph_utils import hint_int, val
from .unanchored import heavy_custom_op

aten = torch.ops.aten


def _numel(t) -> int:
    return math.prod(hint_int(s) for s in t.shape)


def _gemm(a_index):
    """2 * numel(out) * K, K the last size of argument ``a_index`` (A, or x of a linear)."""
    def count(node, out):
        a = val(node.args[a_index])
        return 2 * _numel(out) * hint_int(a.shape[-1]) if a.dim() >= 1 else 0
    return count


def _conv(node, out):
    if node.target == aten.convolution.default and len(node.args) > 6 and node.args[6]:
        return _conv_transpose(node, out)
    w = val(node.args[1])
    return 2 * _numel(out) * _numel(w) // max(hint_int(w.shape[0]), 1)


def _conv_transpose(node, out):
    """A transposed conv is the fprop's data gradient: every input element meets the
    (C_out / groups) x window weights of its channel, 2 * numel(x) * numel(w) / C_in
    (w is (C_in, C_out / groups, window...); torch.utils.flop_counter's conv_flop)."""
    x, w = val(node.args[0]), val(node.args[1])
    return 2 * _numel(x) * _numel(w) // max(hint_int(w.shape[0]), 1)


def _attention(node, out):
    q, k = val(node.args[0]), val(node.args[1])
    d, dv, lk = hint_int(q.shape[-1]), hint_int(out.shape[-1]), hint_int(k.shape[-2])
    return 2 * (_numel(out) // max(dv, 1)) * lk * (d + dv)


def _einsum_terms(term: str, ndim: int, ell_max: int) -> list:
    """The index names of one einsum operand (or of its output): a letter per named dim,
    and for ``...`` its dims named from the right ("#0" the last), as broadcasting
    aligns them."""
    if "..." not in term:
        return list(term)
    pre, post = term.split("...")
    n = ell_max if ndim < 0 else ndim - len(pre) - len(post)
    return list(pre) + [f"#{i}" for i in reversed(range(n))] + list(post)


def _einsum(node, out):
    """aten.einsum(equation, operands): 2 * the product of the sizes of every index the
    two operands of a step hold, the operands contracted left to right (torch's order
    without opt_einsum), so "bhqd,bhkd->bhqk" counts as the batched GEMM it is:
    2 * b*h*q*k*d. One operand (a permute or a sum) is not matmul-like: 0."""
    equation, operands = node.args[0].replace(" ", ""), [val(t) for t in node.args[1]]
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(operands) < 2 or len(terms) != len(operands):
        return 0
    ell_max = max((t.dim() - len(term.replace("...", "")) for term, t in zip(terms, operands)
                   if "..." in term), default=0)
    names = [_einsum_terms(term, t.dim(), ell_max) for term, t in zip(terms, operands)]
    sizes = {}
    for ns, t in zip(names, operands):
        for name, size in zip(ns, t.shape):
            sizes[name] = max(sizes.get(name, 1), hint_int(size))
    if arrow:
        kept_out = set(_einsum_terms(rhs, -1, ell_max))
    else:       # implicit output: the letters seen once, and the ellipsis
        seen = [n for ns in names for n in ns]
        kept_out = {n for n in seen if seen.count(n) == 1 or n.startswith("#")}
    flops, held = 0, set(names[0])
    for i, ns in enumerate(names[1:], start=1):
        joint = held | set(ns)
        flops += 2 * math.prod(sizes[n] for n in joint)
        later = {n for rest in names[i + 1:] for n in rest}
        held = {n for n in joint if n in kept_out or n in later}
    return flops


# ATen op -> FLOPs of one call (node, its output FakeTensor)
FLOPS = {
    aten.mm.default: _gemm(0), aten.bmm.default: _gemm(0), aten.matmul.default: _gemm(0),
    aten.linear.default: _gemm(0), aten.addmm.default: _gemm(1), aten.baddbmm.default: _gemm(1),
    aten.addbmm.default: _gemm(1), aten.mv.default: _gemm(0), aten.dot.default: _gemm(0),
    aten.einsum.default: _einsum,
    aten.convolution.default: _conv, aten.conv1d.default: _conv, aten.conv2d.default: _conv,
    aten.conv3d.default: _conv, aten.conv1d.padding: _conv, aten.conv2d.padding: _conv,
    aten.conv3d.padding: _conv,
    aten.conv_transpose1d.default: _conv_transpose, aten.conv_transpose2d.input: _conv_transpose,
    aten.conv_transpose3d.input: _conv_transpose,
    aten.scaled_dot_product_attention.default: _attention,
}


def _grouped_mm(node, out):
    """A grouped GEMM (MoE experts): A (tokens, K) against B (experts, K, N), each token
    row meeting one expert's B, is 2 * numel(out) * K whatever the split (also 3-D x 3-D);
    2-D x 2-D splits K among the groups: 2 * numel(A) * N (aten._grouped_mm's forms;
    transformers' grouped_mm_fallback custom op takes the first)."""
    a, b = val(node.args[0]), val(node.args[1])
    if a.dim() == 2 and b.dim() == 2:
        return 2 * _numel(a) * hint_int(b.shape[-1])
    return 2 * _numel(out) * hint_int(a.shape[-1])


if hasattr(aten, "_grouped_mm"):
    FLOPS[aten._grouped_mm.default] = _grouped_mm
GROUPED_MM_CUSTOM = "grouped_mm"
# SDPA's backend ops (graphs traced below its dispatch, e.g. AOTAutograd's for the
# torch.compile backend): the same count, on the first of the outputs they return
_BACKENDS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
FLOPS.update({getattr(aten, name).default: _attention for name in _BACKENDS if hasattr(aten, name)})


class FlopCounts(dict):
    """{node name: FLOPs}; ``data_dependent``: the names among them counted with a size
    known only at run time (an unbacked symbol, e.g. a mixture of experts' tokens per
    expert), which counts as 1: their FLOPs, and the total, are lower bounds."""

    data_dependent: frozenset = frozenset()


def _no_hint(t) -> bool:
    return isinstance(t, torch.Tensor) and any(
        not isinstance(d, int) and getattr(getattr(d, "node", None), "hint", 0) is None for d in t.shape)


def node_flops(gm: fx.GraphModule) -> FlopCounts:
    """{node name: FLOPs} (a FlopCounts) for each op of ``gm`` in FLOPS whose sizes are
    recorded (``meta['val']``); others are absent."""
    out, unsized = FlopCounts(), set()
    for n in gm.graph.nodes:
        fn = FLOPS.get(n.target) if n.op == "call_function" else None
        if fn is None and n.op == "call_function" and GROUPED_MM_CUSTOM in (heavy_custom_op(n.target) or ""):
            fn = _grouped_mm
        res = val(n)
        if isinstance(res, (tuple, list)) and res:
            res = res[0]
        if fn is None or not isinstance(res, torch.Tensor):
            continue
        try:
            out[n.name] = int(fn(n, res))
        except (AttributeError, IndexError, TypeError):      # sizes not recorded
            continue
        if _no_hint(res) or any(_no_hint(val(a)) for a in n.args if isinstance(a, fx.Node)):
            unsized.add(n.name)
    out.data_dependent = frozenset(unsized)
    return out
