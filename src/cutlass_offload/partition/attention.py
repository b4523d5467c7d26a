"""Operand readers of the attention anchors: one fused multi-head attention region
(emit/attention.py's kernel) per match, or UnsupportedRegion with a reason.

Forms matched (fp16 / bf16 / fp32; q, k, v of rank 4 (B, H, L, E) or 3 (N, L, E),
any strides: a BSNH tensor permuted to BNSH is read in place):

* ``aten.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
  is_causal=False, *, scale=None, enable_gqa=False)``; the default scale is
  1 / sqrt(E) (PyTorch's).
* the hand-written form, anchored at its softmax (``aten.softmax.int`` /
  ``aten._softmax``) over the last axis::

      s = matmul(q [* c], k.transpose(-1, -2) [* c])   # or bmm; any number of
      s = s * c | s / c | s + c   (Python numbers)      #   scalings, then at most
      s = s + bias | s.masked_fill(mask, -inf)          #   one bias, in that order
      p = softmax(s [.float()], dim=-1) [.to(q.dtype)]
      o = matmul(p, v)                                  # or bmm

  every intermediate used only inside the form (torch.export's
  ``_assert_tensor_metadata`` checks on them join the region). A softmax that is
  not between two such matmuls is not attention (the reader returns None).

Masks. A mask computable at compile time (no graph input reaches it other than
through its sizes: transformers' causal and padding-free masks, a registered
``tril`` buffer, ``torch.ones(s, s_kv).tril(diagonal=s_kv - s)``) is evaluated and
compared with the kernel's patterns: masking nothing, top-left causal (tril
diagonal 0) or bottom-right causal (diagonal s_kv - s), the same for every batch
and head. Such a mask is folded into ``causal`` and stays an input of the region
for the PyTorch fallback only. A mask whose value depends on dynamic sizes is
evaluated at the example sizes and checked again once per new shape by the
region module (runtime/attention_region.py). Any other mask is the kernel's
additive bias: a float mask of the input dtype as it is, a boolean one as 0 / -inf
(made by the region module). A float mask may mask with -inf or finfo.min; the
fold is exact for rows that see at least one key.

Output. SDPA's output (B, H, L, Ev) is allocated by the region module as BMHK
(B, L, H, Ev) and returned transposed; when it is only transposed back (after
reshapes to its own shape), that transpose joins the region (and a following
``contiguous``), so the region returns the BMHK tensor itself.

Stays in PyTorch, with a reason: dropout_p > 0 (or a training dropout between the
softmax and P @ V), grouped-query attention with more than one K/V head, dynamic
head counts or head dims, mixed dtypes, a bias of another dtype, a scale after the
bias, masks that do not broadcast, and whatever emit/attention.refusal refuses
(head dims not multiples of 4, scale 0 or not finite, ...; at kernel selection).
A negative scale runs as -scale on a negated Q or K.

The code is in three modules: this one (the operands, graph helpers shared by the
forms, the region: ``_finish``, ``make_attention_region``), partition/attention_forms.py
(the readers of each form: ``sdpa_operands``, ``softmax_operands``, the compile-time
mask fold and the output layout) and masks.py (``mask_pattern``, which the region
module also uses at run time).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx as fx

from ..errors import UnsupportedRegion
from ..ir import AttentionProblem, AttentionRegion
from . import kv_groups
from .graph_utils import DTYPE_NAMES, aten, hint_int, same_dim, static_int, tensor_dtype, val
# shared graph helpers, under this module's names (attention_forms imports them from here)
from .graph_utils import aten_arg as _arg, is_call as _call, metadata_checks as _checks, users as _users

_MATMULS = (aten.matmul.default, aten.bmm.default)


@dataclass
class AttentionOperands:
    form: str                     # "sdpa" or "softmax_attention"
    q: fx.Node
    k: fx.Node
    v: fx.Node
    nodes: list                   # the region's nodes (any order; sorted when made)
    output: fx.Node
    scale: float
    causal: str = "none"
    bias: Optional[fx.Node] = None
    bias_kind: str = "none"
    mask: Optional[fx.Node] = None
    mask_kind: str = "none"
    mask_check: bool = False
    k_transposed: bool = False
    out_layout: str = "strided"
    enable_gqa: bool = False
    softcap: float = 0.0          # c of c * tanh(scale * s / c) on the logits s (0: none)
    kv_group: int = 1             # query heads per K/V head read in place (kv_groups.py)
    window: int = 0               # W of a folded sliding-window mask (0: none)
    notes: list = field(default_factory=list)


# ------------------------------------------------------------------------- helpers

def _tensor(node, what) -> torch.Tensor:
    v = val(node)
    if not isinstance(node, fx.Node) or not isinstance(v, torch.Tensor):
        raise UnsupportedRegion(f"{what} is not a tensor")
    return v


def _number(x):
    """x as a Python float when it is a constant real number, else None."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return None
    return float(x)


def _cast_of(n):
    """(source, dtype) when n is a pure dtype cast on the same device, else None."""
    if not isinstance(n, fx.Node) or n.op != "call_function" or not n.args:
        return None
    src = n.args[0]
    sv = val(src)
    if not isinstance(sv, torch.Tensor):
        return None
    if n.target is aten.to.dtype:
        extra = dict(zip(("non_blocking", "copy", "memory_format"), n.args[2:]), **n.kwargs)
        dt = n.args[1] if len(n.args) > 1 else None
    elif n.target in (aten.to.dtype_layout, aten._to_copy.default):
        extra = dict(n.kwargs)
        if len(n.args) > 1:
            return None
        dt = extra.pop("dtype", None)
        if extra.pop("layout", torch.strided) not in (None, torch.strided):
            return None
        dev = extra.pop("device", None)
        if dev is not None and torch.device(dev) != sv.device:
            return None
        extra.pop("pin_memory", None)
    else:
        return None
    if not isinstance(dt, torch.dtype):
        return None
    if any(x not in (None, False, torch.preserve_format) for x in extra.values()):
        return None
    return src, dt


def _is_last_two_transpose(n, rank) -> bool:
    """n swaps the last two dims of its (rank-D) input."""
    if _call(n, aten.transpose.int) and len(n.args) == 3:
        dims = sorted(d % rank for d in n.args[1:])
        return dims == [rank - 2, rank - 1]
    if _call(n, aten.permute.default):
        return list(d % rank for d in n.args[1]) == list(range(rank - 2)) + [rank - 1, rank - 2]
    return False


def _is_heads_transpose(n) -> bool:
    """n turns a (B, H, L, E) tensor into (B, L, H, E)."""
    if _call(n, aten.transpose.int) and len(n.args) == 3:
        return sorted(d % 4 for d in n.args[1:]) == [1, 2]
    if _call(n, aten.permute.default):
        return [d % 4 for d in n.args[1]] == [0, 2, 1, 3]
    return False


def _scaled(n):
    """(x, c) when n is x * c, c * x or x / c with a tensor node x and a number c, else None."""
    if _call(n, aten.mul.Tensor, aten.mul.Scalar) and len(n.args) == 2 and not n.kwargs:
        a, b = n.args
        if isinstance(a, fx.Node) and _number(b) is not None:
            return a, _number(b)
        if isinstance(b, fx.Node) and _number(a) is not None:
            return b, _number(a)
    if _call(n, aten.div.Tensor, aten.div.Scalar) and len(n.args) == 2 and not n.kwargs:
        a, c = n.args[0], _number(n.args[1])
        if isinstance(a, fx.Node) and c is not None and c != 0:
            return a, 1.0 / c
    return None


def _shifted(n):
    """x when n is x + c (c a number; softmax ignores it), else None."""
    if _call(n, aten.add.Tensor, aten.add.Scalar) and len(n.args) == 2 \
            and n.kwargs.get("alpha", 1) == 1:
        a, b = n.args
        if isinstance(a, fx.Node) and _number(b) is not None:
            return a
        if isinstance(b, fx.Node) and _number(a) is not None:
            return b
    return None


def _logits_source(n, depth=12):
    """For a node between q @ k^T and the softmax: the operand carrying the logits
    (the one that leads back to a matmul through such nodes), or None."""
    if not isinstance(n, fx.Node) or n.op != "call_function" or not n.args or depth <= 0:
        return None
    c = _cast_of(n)
    if c is not None:
        return c[0]
    if _call(n, aten.tanh.default) and len(n.args) == 1:     # a soft-cap (Gemma 2)
        return n.args[0]
    sc = _scaled(n) or ((_shifted(n),) if _shifted(n) is not None else None)
    if sc is not None:
        return sc[0]
    if _call(n, aten.masked_fill.Scalar):
        return n.args[0]
    if _call(n, aten.add.Tensor) and len(n.args) == 2:
        hits = [a for a in n.args if _reaches_matmul(a, depth - 1)]
        return hits[0] if len(hits) == 1 else None
    return None


def _reaches_matmul(n, depth) -> bool:
    while isinstance(n, fx.Node) and depth > 0:
        if _call(n, *_MATMULS):
            return True
        n, depth = _logits_source(n, depth - 1), depth - 1
    return False


def _gcd(x) -> int:
    """The largest integer known to divide x (an int or a SymInt); 0 for 0."""
    s = static_int(x)
    if s is not None:
        return abs(int(s))
    try:
        import sympy
        expr = sympy.expand(x.node.expr)
    except (AttributeError, ImportError):
        return 1
    g = 0
    for term in sympy.Add.make_args(expr):
        c, _ = term.as_coeff_Mul()
        if not c.is_Integer:
            return 1
        g = math.gcd(g, int(c))
    return g or 1


def _alignment(values, dtype: str) -> int:
    """Largest of 8/4/2/1 elements (4/2/1 for fp32: 16 bytes at most) dividing all values."""
    top = 4 if dtype == "f32" else 8
    gs = [_gcd(x) for x in values]
    a = top
    while a > 1 and any(g % a for g in gs):
        a //= 2
    return a


# ---------------------------------------------------------------------- the region

def _dtype(node, what) -> str:
    _tensor(node, what)                  # a graph node's tensor, not a constant
    return tensor_dtype(node, what)


def _leading(shape, rank):
    """(batch, heads) sizes of a rank-4 (B, H, L, E) / rank-3 (N, L, E) shape."""
    return (shape[0], shape[1]) if rank == 4 else (shape[0], 1)


def _broadcast_dim(sizes, what):
    """The common size of sizes that are each it or 1 (static 1), else UnsupportedRegion."""
    big = [s for s in sizes if static_int(s) != 1]
    if not big:
        return 1
    first = big[0]
    if not all(same_dim(s, first) for s in big[1:]):
        raise UnsupportedRegion(f"{what} sizes {[str(s) for s in sizes]} do not match or broadcast")
    return first


def _bmhk_strides(v: torch.Tensor, rank, shape=None, strides=None):
    """[storage offset, batch, seq, head strides] of an operand as the kernel reads it
    (0 for a dim of size 1: broadcast or irrelevant)."""
    shape = list(shape or v.shape)
    st = list(strides or v.stride())
    if static_int(st[-1]) != 1:            # the region module makes it contiguous
        st, off = list(torch._prims_common.make_contiguous_strides_for(shape)), 0
    else:
        off = v.storage_offset()
    dims = (0, 2, 1) if rank == 4 else (0, 1)
    return [off] + [0 if static_int(shape[d]) == 1 else st[d] for d in dims]


def _check_bias_shape(b: torch.Tensor, scores_shape, what):
    """Dims of (batch, heads, queries) the bias broadcasts over; UnsupportedRegion when
    it does not broadcast to the logits."""
    rank = len(scores_shape)
    if b.dim() > rank:
        raise UnsupportedRegion(f"{what} of rank {b.dim()} for rank-{rank} logits")
    shape = [1] * (rank - b.dim()) + list(b.shape)
    for have, want in zip(shape, scores_shape):
        if static_int(have) != 1 and not same_dim(have, want):
            raise UnsupportedRegion(f"{what} of shape {tuple(b.shape)} does not broadcast to the "
                                    f"logits {tuple(scores_shape)}")
    names = ("batch", "heads", "queries") if rank == 4 else ("batch", "queries")
    lead = shape[:-1]
    return tuple(n for n, s, full in zip(names, lead, scores_shape[:-1])
                 if static_int(s) == 1 and static_int(full) != 1)


def _finish(ops: AttentionOperands, enable_gqa=False):
    """Shapes, dtypes and strides of a matched form: (problem kwargs) or UnsupportedRegion."""
    qv, kv, vv = (_tensor(n, w) for n, w in ((ops.q, "q"), (ops.k, "k"), (ops.v, "v")))
    dtype = _dtype(ops.q, "q")
    if _dtype(ops.k, "k") != dtype or _dtype(ops.v, "v") != dtype:
        raise UnsupportedRegion(f"mixed dtypes q {qv.dtype}, k {kv.dtype}, v {vv.dtype}")
    rank = qv.dim()
    if rank not in (3, 4) or kv.dim() != rank or vv.dim() != rank:
        raise UnsupportedRegion(f"q, k, v of ranks {qv.dim()}, {kv.dim()}, {vv.dim()} (only "
                                "(B, H, L, E) or (N, L, E) tensors are offloaded)")
    kshape, kstride = list(kv.shape), list(kv.stride())
    if ops.k_transposed:                  # the input is K^T: (..., E, S)
        kshape[-2:], kstride[-2:] = kshape[-2:][::-1], kstride[-2:][::-1]
    e, ek, ev = static_int(qv.shape[-1]), static_int(kshape[-1]), static_int(vv.shape[-1])
    if e is None or ek is None or ev is None:
        raise UnsupportedRegion("dynamic head dim")
    if e != ek:
        raise UnsupportedRegion(f"q head dim {e} != k head dim {ek}")
    if not same_dim(kshape[-2], vv.shape[-2]):
        raise UnsupportedRegion(f"k has {kshape[-2]} keys, v {vv.shape[-2]}")
    lead = [_leading(s, rank) for s in (qv.shape, kshape, vv.shape)]
    heads = [static_int(h) for _, h in lead]
    if None in heads:
        raise UnsupportedRegion("dynamic number of heads")
    h = max(heads)
    group = ops.kv_group
    if group == 1 and enable_gqa and kv_groups.GQA_IN_PLACE and heads[1] == heads[2] \
            and 1 < heads[1] < heads[0] and heads[0] % heads[1] == 0:
        group = heads[0] // heads[1]
        ops.notes.append(f"grouped-query attention: {group} query heads per K/V head, K and V "
                         "read in place")
    for what, hh in (("q", heads[0]), ("k", heads[1]), ("v", heads[2])):
        if group > 1:
            if hh * (1 if what == "q" else group) != h:
                raise UnsupportedRegion(f"grouped-query attention: {what} has {hh} heads for "
                                        f"{h} query heads in groups of {group}")
        elif hh not in (1, h):
            if enable_gqa or what != "q":
                why = ("its K/V heads do not divide the query heads evenly" if kv_groups.GQA_IN_PLACE
                       else "read in place only with partition/kv_groups.GQA_IN_PLACE on")
                raise UnsupportedRegion(
                    f"grouped-query attention: {heads[1]} K/V heads for {heads[0]} query heads "
                    f"({why}; repeating K and V per query head first, k.repeat_interleave("
                    "heads // kv_heads, dim=1) as transformers' repeat_kv does, makes it one "
                    "attention region)")
            raise UnsupportedRegion(f"{what} has {hh} heads, the others {h}")
    batch = _broadcast_dim([b for b, _ in lead], "batch")
    seq_q, seq_kv = qv.shape[-2], kshape[-2]
    strides = (_bmhk_strides(qv, rank) + _bmhk_strides(kv, rank, kshape, kstride)
               + _bmhk_strides(vv, rank))
    align = _alignment(strides, dtype)
    bias_broadcast = ()
    if ops.bias is not None:
        bv = _tensor(ops.bias, "the mask")
        if ops.bias_kind == "float" and DTYPE_NAMES.get(bv.dtype) != dtype:
            raise UnsupportedRegion(f"a {bv.dtype} bias on {qv.dtype} attention (the kernel adds "
                                    "a bias of the input dtype)")
        scores = ([batch, h] if rank == 4 else [batch]) + [seq_q, seq_kv]
        bias_broadcast = _check_bias_shape(bv, scores, "the mask")
        if static_int(bv.shape[-1]) == 1 and static_int(seq_kv) != 1:
            ops.notes.append("a mask broadcast over keys is expanded for each call")
    if ops.mask is not None and ops.bias is None:
        _check_bias_shape(_tensor(ops.mask, "the mask"),
                          ([batch, h] if rank == 4 else [batch]) + [seq_q, seq_kv], "the mask")
    if any(st[-1] != 1 for st in (qv.stride(), kstride, vv.stride())):
        ops.notes.append("an operand whose head dim is not contiguous is copied for each call")
    scale = ops.scale
    negate = scale < 0
    try:
        problem = AttentionProblem(
            heads=h, seq_q=static_int(seq_q), seq_kv=static_int(seq_kv), head_dim=e,
            head_dim_v=ev, dtype=dtype, scale=-scale if negate else scale,
            batch=static_int(batch), causal=ops.causal, softcap=ops.softcap, kv_group=group,
            window=ops.window,
            bias="add" if ops.bias is not None else "none",
            bias_broadcast=bias_broadcast if ops.bias is not None else (), align=align,
            batch_hint=max(1, hint_int(batch)))
    except ValueError as ex:
        raise UnsupportedRegion(str(ex)) from ex
    if negate and ops.softcap:
        raise UnsupportedRegion(f"a tanh soft-cap with a negative scale {scale}")
    if negate:
        ops.notes.append(f"negative scale {scale}: runs as {-scale} on -q (or -k)")
    return problem, rank, negate


def _region_nodes(ops: AttentionOperands) -> list:
    """The region's nodes in graph order with the metadata checks on intermediates;
    UnsupportedRegion when an intermediate is used outside or the order is wrong."""
    members = set(ops.nodes)
    for n in list(ops.nodes):
        if n is not ops.output:
            members.update(_checks(n))
    order = {n: i for i, n in enumerate(ops.output.graph.nodes)}
    nodes = sorted(members, key=order.__getitem__)
    if nodes[-1] is not ops.output:
        raise UnsupportedRegion("a node of the form comes after its output")
    for n in nodes[:-1]:
        if not set(n.users) <= members:
            raise UnsupportedRegion(f"intermediate {n.name} is used outside the attention")
    return nodes


def make_attention_region(index: int, ops: AttentionOperands) -> AttentionRegion:
    """The AttentionRegion of matched operands (UnsupportedRegion with a reason)."""
    kv_groups.read_in_place(ops)
    problem, rank, negate = _finish(ops, ops.enable_gqa)
    nodes = _region_nodes(ops)
    name = f"region{index}_attention_{problem.epilogue.tag}"
    return AttentionRegion(
        name=name, form=ops.form, nodes=tuple(n.name for n in nodes), q=ops.q.name,
        k=ops.k.name, v=ops.v.name, problem=problem,
        bias=ops.bias.name if ops.bias is not None else None, bias_kind=ops.bias_kind,
        mask=ops.mask.name if ops.mask is not None else None, mask_kind=ops.mask_kind,
        mask_check=ops.mask_check, k_transposed=ops.k_transposed, negate=negate,
        out_layout=ops.out_layout, rank=rank, notes=tuple(ops.notes),
        anchor=ops.nodes[0].name if ops.form == "sdpa" else
        next((n.name for n in ops.nodes if _call(n, aten.softmax.int, aten._softmax.default)), ""))


def make_attention(index, node, ops: AttentionOperands, options, taken) -> tuple:
    """(AttentionRegion, its nodes) for a matched attention; UnsupportedRegion when
    it overlaps another region (its q @ k^T / p @ v matmuls are claimed first: the
    attention rows match in the first pass)."""
    if any(n in taken for n in ops.nodes):
        raise UnsupportedRegion("overlaps another region")
    region = make_attention_region(index, ops)
    by_name = {n.name: n for n in node.graph.nodes}
    return region, [by_name[n] for n in region.nodes]
