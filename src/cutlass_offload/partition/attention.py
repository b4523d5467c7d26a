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
"""
from __future__ import annotations

import math
import numbers
import weakref
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx as fx

from ..errors import UnsupportedRegion
from ..ir import AttentionProblem, AttentionRegion
from .graph_utils import DTYPE_NAMES, aten, hint_int, same_dim, same_shape, static_int, val

_ASSERT = getattr(aten, "_assert_tensor_metadata", None)
_ASSERT = _ASSERT.default if _ASSERT is not None else None
_MATMULS = (aten.matmul.default, aten.bmm.default)
_SAME_SHAPE_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_MAX_FOLD_NODES = 512            # a mask computed by more ops is not evaluated
_MAX_FOLD_ELEMENTS = 1 << 26


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
    notes: list = field(default_factory=list)


# ------------------------------------------------------------------------- helpers

def _call(n, *targets) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def _users(n) -> list:
    """Users of n, less the metadata checks torch.export inserts (they join the region)."""
    return [u for u in n.users if u.target is not _ASSERT]


def _checks(n) -> list:
    return [u for u in n.users if u.target is _ASSERT]


def _arg(node, index, name):
    """Argument ``name`` of an ATen call: positional, keyword or the schema default."""
    if len(node.args) > index:
        return node.args[index]
    if name in node.kwargs:
        return node.kwargs[name]
    for a in node.target._schema.arguments:
        if a.name == name:
            return a.default_value if a.has_default_value() else None
    return None


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


# -------------------------------------------------------------- compile-time masks

_FOLDS = weakref.WeakKeyDictionary()      # graph -> {mask node: (value, symbolic) | None}


# ops whose value is not a function of their arguments (uninitialized memory)
_UNINITIALIZED = ("empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided")


def _pure(target) -> bool:
    if isinstance(target, torch._ops.OpOverload):
        if target._schema.is_mutable or target.overloadpacket.__name__ in _UNINITIALIZED:
            return False
        return torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ())
    return getattr(target, "__module__", None) in ("_operator", "operator") or target is math.sqrt


def _attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def constant_value(node: fx.Node):
    """(tensor, symbolic) when ``node``'s value is computable from the graph's constants
    and input sizes (``symbolic``: it depends on dynamic sizes and was evaluated at
    the example sizes), else None."""
    graph = node.graph
    memo = _FOLDS.setdefault(graph, {})
    if node in memo:
        return memo[node]
    memo[node] = result = _evaluate(node)
    return result


def _evaluate(node):
    stack, anc, symbolic = [node], set(), False
    while stack:
        n = stack.pop()
        if n in anc:
            continue
        if n.op == "get_attr":
            anc.add(n)
            continue
        if n.op != "call_function":
            return None                           # a graph input: data-dependent
        if n.target is aten.sym_size.int:         # a size of an input: its example value
            anc.add(n)
            symbolic = True
            continue
        if not _pure(n.target):
            return None
        anc.add(n)
        if len(anc) > _MAX_FOLD_NODES:
            return None
        stack.extend(n.all_input_nodes)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    gm = node.graph.owning_module
    env = {}
    try:
        with torch.no_grad():
            for n in sorted(anc, key=order.__getitem__):
                if n.op == "get_attr":
                    env[n] = _attr(gm, n.target)
                elif n.target is aten.sym_size.int:
                    env[n] = hint_int(val(n), default=-1)
                    if env[n] < 0:
                        return None
                else:
                    args = fx.node.map_arg(n.args, env.__getitem__)
                    kwargs = fx.node.map_arg(n.kwargs, env.__getitem__)
                    env[n] = n.target(*args, **kwargs)
                    if isinstance(env[n], torch.Tensor) and env[n].numel() > _MAX_FOLD_ELEMENTS:
                        return None
    except Exception:                   # noqa: BLE001 (not evaluable: the mask is a bias)
        return None
    out = env[node]
    if not isinstance(out, torch.Tensor) or out.dim() < 1:
        return None
    return out, symbolic


def mask_pattern(m: torch.Tensor, kind: str, seq_q: int, seq_kv: int):
    """(pattern, soft) when mask ``m`` (read as ``kind``: "bool_keep" True = attend,
    "bool_masked" True = masked, "float" additive) masks the same way for every batch
    and head as one of the kernel's patterns: "none" (nothing masked), "top_left" or
    "bottom_right" (causal); else None. soft: a float mask masking with finfo.min
    (exact only for rows that see a key). Synchronizes on a CUDA tensor."""
    if seq_q < 1 or seq_kv < 1 or m.dim() < 1:
        return None
    soft = False
    if kind == "float":
        if not m.is_floating_point():
            return None
        keep = m == 0
        low = m == torch.finfo(m.dtype).min
        if not bool((keep | torch.isneginf(m) | low).all()):
            return None
        soft = bool(low.any())
    else:
        if m.dtype != torch.bool:
            return None
        keep = m if kind == "bool_keep" else ~m
    if keep.dim() < 2:
        keep = keep.reshape((1,) * (2 - keep.dim()) + tuple(keep.shape))
    try:
        keep = keep.expand(*keep.shape[:-2], seq_q, seq_kv)
    except RuntimeError:
        return None
    flat = keep.reshape(-1, seq_q, seq_kv)
    first = flat[0]
    if flat.shape[0] > 1 and not bool((flat == first).all()):
        return None
    if bool(first.all()):
        return "none", soft
    rows = torch.arange(seq_q, device=m.device)[:, None]
    cols = torch.arange(seq_kv, device=m.device)[None, :]
    if torch.equal(first, cols <= rows):
        return "top_left", soft
    if torch.equal(first, cols <= rows + (seq_kv - seq_q)):
        return "bottom_right", soft
    return None


def _fold_mask(mask: fx.Node, kind: str, seq_q, seq_kv):
    """(causal, symbolic) when ``mask`` folds into the kernel's causal argument."""
    got = constant_value(mask)
    if got is None:
        return None
    value, symbolic = got
    lq, lk = hint_int(seq_q, -1), hint_int(seq_kv, -1)
    if lq < 1 or lk < 1:
        return None
    try:
        found = mask_pattern(value, kind, lq, lk)
    except RuntimeError:
        return None
    if found is None:
        return None
    pattern, soft = found
    if soft and pattern == "bottom_right":
        # finfo.min masks rows with no key softly (PyTorch averages them): exact only
        # while every row sees a key, i.e. seq_q <= seq_kv, provably
        sq, sk = static_int(seq_q), static_int(seq_kv)
        if sq is None or sk is None or sq > sk:
            return None
    return pattern, symbolic


# ---------------------------------------------------------------------- the region

def _dtype(node, what) -> str:
    v = _tensor(node, what)
    if v.dtype not in DTYPE_NAMES:
        raise UnsupportedRegion(f"{what} has unsupported dtype {v.dtype}")
    return DTYPE_NAMES[v.dtype]


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
    for what, hh in (("q", heads[0]), ("k", heads[1]), ("v", heads[2])):
        if hh not in (1, h):
            if enable_gqa or what != "q":
                raise UnsupportedRegion(
                    f"grouped-query attention: {heads[1]} K/V heads for {heads[0]} query heads "
                    "(only K/V shared by every head, or one K/V head per query head, is offloaded)")
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
            batch=static_int(batch), causal=ops.causal,
            bias="add" if ops.bias is not None else "none",
            bias_broadcast=bias_broadcast if ops.bias is not None else (), align=align,
            batch_hint=max(1, hint_int(batch)))
    except ValueError as ex:
        raise UnsupportedRegion(str(ex)) from ex
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
    problem, rank, negate = _finish(ops, ops.enable_gqa)
    nodes = _region_nodes(ops)
    name = f"region{index}_attention_{problem.epilogue.tag}"
    return AttentionRegion(
        name=name, form=ops.form, nodes=tuple(n.name for n in nodes), q=ops.q.name,
        k=ops.k.name, v=ops.v.name, problem=problem,
        bias=ops.bias.name if ops.bias is not None else None, bias_kind=ops.bias_kind,
        mask=ops.mask.name if ops.mask is not None else None, mask_kind=ops.mask_kind,
        mask_check=ops.mask_check, k_transposed=ops.k_transposed, negate=negate,
        out_layout=ops.out_layout, rank=rank, notes=tuple(ops.notes))


# ------------------------------------------------------------------ output layout

def _view_ok(shape, strides, target) -> bool:
    """A ``view`` to ``target`` works on a tensor of this shape and these strides."""
    if any(static_int(x) is None for x in list(shape) + list(target)):
        return False
    try:
        torch.empty_strided(tuple(shape), tuple(strides), device="meta").view(tuple(target))
        return True
    except RuntimeError:
        return False


def _absorb_output(out: fx.Node, rank: int):
    """(region output, extra nodes, out_layout): a transpose of the (B, H, L, Ev)
    output to (B, L, H, Ev) (after reshapes to its own shape, before a
    ``contiguous``) joins the region, which then returns the BMHK tensor."""
    if rank != 4:
        return out, [], "strided"
    x, extra = out, []
    while True:
        users = _users(x)
        if len(users) != 1:
            break
        u = users[0]
        if _call(u, *_SAME_SHAPE_VIEWS) and same_shape(val(u).shape, val(x).shape):
            extra.append(u)
            x = u
            continue
        if _is_heads_transpose(u):
            extra.append(u)
            users = _users(u)
            if len(users) == 1 and (_call(users[0], aten.contiguous.default) or (
                    _call(users[0], aten.clone.default)
                    and users[0].kwargs.get("memory_format") in (None, torch.contiguous_format))):
                extra.append(users[0])
                return users[0], extra, "bmhk"
            return u, extra, "bmhk"
        break
    # not transposed back: (B, H, L, Ev) strided over a BMHK buffer; a view that
    # needs other strides gets a contiguous copy
    v = val(out)
    shape = tuple(v.shape)
    strides = None
    if all(static_int(d) is not None for d in shape):
        b, h, l, e = shape
        strides = (l * h * e, e, h * e, 1)
    for u in out.users:
        if _call(u, aten.view.default, aten._unsafe_view.default):
            if strides is None or not _view_ok(shape, strides, u.args[1]):
                return out, [], "contiguous"
    return out, [], "strided"


# --------------------------------------------------------------------------- SDPA

def sdpa_operands(node, options) -> AttentionOperands:
    """aten.scaled_dot_product_attention.default."""
    q, k, v = node.args[:3]
    mask = _arg(node, 3, "attn_mask")
    dropout = _arg(node, 4, "dropout_p")
    is_causal = _arg(node, 5, "is_causal")
    scale = node.kwargs.get("scale", None)
    enable_gqa = node.kwargs.get("enable_gqa", False)
    if _number(dropout) is None or _number(dropout) != 0.0:
        raise UnsupportedRegion(f"dropout_p={dropout} (attention dropout runs in PyTorch)")
    if not isinstance(is_causal, bool):
        raise UnsupportedRegion(f"is_causal={is_causal!r} is not a constant")
    qv = _tensor(q, "q")
    e = static_int(qv.shape[-1])
    if scale is None:
        if e is None:
            raise UnsupportedRegion("dynamic head dim")
        scale = 1.0 / math.sqrt(e)
    elif _number(scale) is None:
        raise UnsupportedRegion(f"scale {scale!r} is not a constant number")
    ops = AttentionOperands("sdpa", q, k, v, [node], node, float(scale),
                            causal="top_left" if is_causal else "none")
    if mask is not None:
        mv = _tensor(mask, "attn_mask")
        kind = "bool_keep" if mv.dtype == torch.bool else "float"
        if is_causal:
            raise UnsupportedRegion("attn_mask together with is_causal=True")
        lk = _tensor(k, "k").shape[-2]
        folded = _fold_mask(mask, kind, qv.shape[-2], lk)
        if folded is not None:
            ops.causal, ops.mask_check = folded
            ops.mask, ops.mask_kind = mask, kind
            ops.notes.append(f"attn_mask {mask.name} folded: {folded[0]}"
                             + (" (checked once per shape)" if folded[1] else ""))
        else:
            ops.bias, ops.bias_kind = mask, kind
    ops.output, extra, ops.out_layout = _absorb_output(node, qv.dim())
    ops.nodes += extra
    ops.enable_gqa = enable_gqa is True
    return ops


# ---------------------------------------------------------------- hand-written form

def _single_user(n) -> Optional[fx.Node]:
    users = _users(n)
    return users[0] if len(users) == 1 and len(n.users) == len(users) + len(_checks(n)) else None


def softmax_operands(node, options) -> Optional[AttentionOperands]:
    """The hand-written attention around a softmax over the last axis; None when this
    softmax is not between a q @ k^T and a p @ v matmul."""
    x = node.args[0]
    xv = val(x)
    if not isinstance(xv, torch.Tensor) or xv.dim() not in (3, 4):
        return None
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if not isinstance(dim, int) or dim % xv.dim() != xv.dim() - 1:
        return None
    # -- logits, walked back from the softmax to the q @ k^T matmul
    chain, cur = [], x
    while isinstance(cur, fx.Node) and not _call(cur, *_MATMULS) and len(chain) < 12:
        chain.append(cur)
        cur = _logits_source(cur)
    if not _call(cur, *_MATMULS):
        return None
    mm = cur
    # -- probabilities, walked forward from the softmax to the p @ v matmul
    tail, p = [], node
    nxt = _single_user(p)
    while nxt is not None and len(tail) < 3 and not _call(nxt, *_MATMULS):
        tail.append(nxt)
        p, nxt = nxt, _single_user(nxt)
    if nxt is None or not _call(nxt, *_MATMULS) or nxt.args[0] is not p:
        return None
    pv = nxt
    # from here on it is attention: refusals become fallbacks with a reason
    return _read_softmax_form(node, mm, list(reversed(chain)), tail, pv)


def _read_softmax_form(softmax, mm, chain, tail, pv) -> AttentionOperands:
    what = "hand-written attention"
    rank = val(mm).dim()
    a, b = mm.args[0], mm.args[1]
    nodes = [mm, softmax, pv]
    scale = 1.0
    # q side: q [* c]
    sc = _scaled(a)
    if sc is not None and _single_user(a) is mm and a is not b:
        nodes.append(a)
        a, f = sc
        scale *= f
    # k side: k.transpose(-1, -2) [* c], (k * c).transpose(-1, -2), or K^T as given
    k, k_transposed, consumer = b, True, mm
    for _ in range(3):
        if not isinstance(k, fx.Node) or k is a or _single_user(k) is not consumer:
            break
        sc = _scaled(k)
        if sc is not None:
            nodes.append(k)
            consumer, (k, f) = k, sc
            scale *= f
            continue
        if k_transposed and _is_last_two_transpose(k, rank):
            nodes.append(k)
            consumer, k, k_transposed = k, k.args[0], False
            continue
        break
    q = a
    # logits: [casts | scalings | number shifts]* then at most one bias
    add_bias = fill = fill_value = None   # one additive bias, one masked_fill(mask, -inf)
    dtype_in = val(q).dtype
    for n in chain:
        c = _cast_of(n)
        if c is not None:
            if c[1] != torch.float32 and c[1] != dtype_in:
                raise UnsupportedRegion(f"{what}: logits cast to {c[1]}")
            nodes.append(n)
            continue
        src = [x for x in n.args if isinstance(x, fx.Node) and (x is mm or x in nodes)]
        if len(src) != 1:
            raise UnsupportedRegion(f"{what}: {n.name} ({n.target}) combines the logits with "
                                    "another tensor")
        s = src[0]
        sc = _scaled(n)
        if sc is not None and sc[0] is s:
            if add_bias is not None or fill is not None:
                raise UnsupportedRegion(f"{what}: the logits are scaled after the mask "
                                        "(the kernel scales before adding it)")
            scale *= sc[1]
            nodes.append(n)
            continue
        if _call(n, aten.add.Tensor, aten.add.Scalar) and len(n.args) == 2:
            if n.kwargs.get("alpha", 1) != 1:
                raise UnsupportedRegion(f"{what}: add with alpha")
            other = n.args[1] if n.args[0] is s else n.args[0]
            if _number(other) is not None:        # softmax is shift-invariant
                nodes.append(n)
                continue
            if add_bias is not None:
                raise UnsupportedRegion(f"{what}: more than one bias is added to the logits")
            add_bias = other
            nodes.append(n)
            continue
        if _call(n, aten.masked_fill.Scalar) and n.args[0] is s and len(n.args) == 3:
            value = _number(n.args[2])
            if value is None or not (value == -math.inf
                                     or value == torch.finfo(val(s).dtype).min):
                raise UnsupportedRegion(f"{what}: masked_fill with {n.args[2]!r} (only -inf or "
                                        "finfo.min mask the kernel's way)")
            if fill is not None:
                raise UnsupportedRegion(f"{what}: more than one masked_fill on the logits")
            fill, fill_value = n.args[1], value
            nodes.append(n)
            continue
        raise UnsupportedRegion(f"{what}: {n.target} between q @ k^T and the softmax")
    # softmax and what follows it: a cast back to the input dtype
    for n in tail:
        c = _cast_of(n)
        if c is not None and c[1] == dtype_in:
            nodes.append(n)
            continue
        if _call(n, aten.dropout.default, aten.native_dropout.default):
            raise UnsupportedRegion(f"{what}: dropout (p={n.args[1]}) on the probabilities")
        raise UnsupportedRegion(f"{what}: {n.target} between the softmax and p @ v")
    if val(pv.args[0]).dtype != dtype_in:
        raise UnsupportedRegion(f"{what}: p @ v in {val(pv.args[0]).dtype} on {dtype_in} inputs")
    for n, w in ((mm, "q @ k^T"), (pv, "p @ v")):
        if val(n).dim() != rank or val(n.args[0]).dim() != rank or val(n.args[1]).dim() != rank:
            raise UnsupportedRegion(f"{what}: {w} is not a rank-{rank} batched matmul")
    if val(mm).dtype != dtype_in:
        raise UnsupportedRegion(f"{what}: q @ k^T in {val(mm).dtype}")
    ops = AttentionOperands("softmax_attention", q, k, pv.args[1], nodes, pv, scale,
                            k_transposed=k_transposed)
    lq, lk = val(mm).shape[-2], val(mm).shape[-1]
    folded_fill = None
    if fill is not None:
        if not isinstance(fill, fx.Node) or _tensor(fill, "the mask").dtype != torch.bool:
            raise UnsupportedRegion(f"{what}: masked_fill with a mask that is not boolean")
        folded_fill = _fold_mask(fill, "bool_masked", lq, lk)
        if folded_fill is not None and fill_value != -math.inf and folded_fill[0] == "bottom_right" \
                and not (static_int(lq) is not None and static_int(lk) is not None
                         and static_int(lq) <= static_int(lk)):
            folded_fill = None            # finfo.min fills rows with no key softly
        if folded_fill is not None:
            ops.causal, ops.mask_check = folded_fill
            ops.mask, ops.mask_kind = fill, "bool_masked"
            ops.notes.append(f"mask {fill.name} folded: {folded_fill[0]}"
                             + (" (checked once per shape)" if folded_fill[1] else ""))
        elif fill_value != -math.inf:
            raise UnsupportedRegion(f"{what}: masked_fill with finfo.min and a mask that is not a "
                                    "compile-time causal pattern (rows with no key would differ)")
        elif add_bias is not None:
            raise UnsupportedRegion(f"{what}: a bias and a boolean mask that is not a "
                                    "compile-time causal pattern (the kernel takes one bias)")
        else:
            ops.bias, ops.bias_kind = fill, "bool_masked"
    if add_bias is not None:
        if not isinstance(add_bias, fx.Node):
            raise UnsupportedRegion(f"{what}: the bias is not a tensor")
        folded = _fold_mask(add_bias, "float", lq, lk) if folded_fill is None else None
        if folded is not None:
            ops.causal, ops.mask_check = folded
            ops.mask, ops.mask_kind = add_bias, "float"
            ops.notes.append(f"mask {add_bias.name} folded: {folded[0]}"
                             + (" (checked once per shape)" if folded[1] else ""))
        else:
            ops.bias, ops.bias_kind = add_bias, "float"
    ops.output, extra, ops.out_layout = _absorb_output(pv, rank)
    ops.nodes += extra
    return ops
