"""Operand readers of the normalization anchors: layer_norm and rms_norm over the
LAST axis, or UnsupportedRegion with a reason (the op stays in PyTorch).

Forms matched (fp16 / bf16 / fp32, affine weight and bias optional):

* ``aten.layer_norm(x, [C], weight, bias, eps)``: normalized_shape = the last dim;
  ``aten.native_layer_norm`` alike when only its normalized output is used
  (the torch.compile backend's AOTAutograd graphs).
* ``aten.rms_norm(x, [C], weight, eps)``, eps given or PyTorch's default.
* the RMS norm written out, as transformers writes it (LlamaRMSNorm, T5LayerNorm,
  and the like), anchored at its ``rsqrt``::

      xf = x.to(float32)                       # optional when x is already fp32
      r  = rsqrt(mean(xf.pow(2), [-1], keepdim=True) + eps)    # or xf * xf
      y  = xf * r                              # or x * r (promotes to fp32)
      y  = y.to(x.dtype)                       # optional when y already is x.dtype
      y  = weight * y                          # optional, weight (C,) of x.dtype, or
                                               # (1 + weight.float()) * y in fp32 (Gemma),
                                               # or weight.to(fp32) * y (Cohere)
      y  = y.to(x.dtype)                       # when weight * y was fp32 (AOTAutograd's
                                               # decomposition of aten.rms_norm)

  The layer norm written out the same way (Cohere's LayerNorm, no bias) is matched at
  its ``rsqrt`` too: ``rsqrt(mean((xf - mean(xf))^2) + eps)`` multiplied into
  ``xf - mean(xf)`` (the same node or a second one computed alike).

  The statistics must be fp32; every intermediate must be used only inside the
  form (the ``_assert_tensor_metadata`` checks torch.export inserts before each
  ``.to`` join the region). An ``rsqrt`` that is not of this shape is not a norm
  (the reader returns None: no region, no fallback).

eps is read from the graph: the op's argument (or its schema default for
layer_norm), the constant added in the written-out form. ``aten.rms_norm``
without an eps takes PyTorch's default, the epsilon of the computation type
(float32's for every input dtype offloaded).

A zero-centred weight, ``1 + weight`` (either order, the weight cast to fp32 or not:
Gemma's ``x_norm * (1.0 + weight.float())``, Nemotron's ``layer_norm(x, ..., weight + 1)``),
is read as the weight with ``unit_offset`` (the kernel scales by 1 + weight in fp32), its
add and cast joining the region.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx as fx

from ..errors import LeftByChoice, UnsupportedRegion
from ..ir import NormProblem, NormRegion, note_not_fused, note_stops
from .graph_utils import DTYPE_NAMES, aten, hint_int, max_alignment, static_int, tensor_dtype, val
# shared graph helpers, under this module's names (attention_forms imports them from here)
from .graph_utils import aten_arg as _arg, is_call as _call, metadata_checks as _checks, users as _users



@dataclass
class NormOperands:
    form: str                     # "layer_norm", "rms_norm", "{rms,layer}_norm_decomposed"
    kind: str                     # "layer_norm" or "rms_norm"
    x: fx.Node
    cols: int
    dtype: str
    eps: float
    nodes: list                   # the region's nodes in graph order; the last is its output
    weight: Optional[fx.Node] = None
    bias: Optional[fx.Node] = None
    notes: list = field(default_factory=list)
    unit_offset: bool = False     # y scaled by (1 + weight): the weight is zero-centred


def _cols(x) -> int:
    xv = val(x)
    if xv.dim() < 1:
        raise UnsupportedRegion("a 0-d input has no axis to normalize")
    cols = static_int(xv.shape[-1])
    if cols is None:
        raise UnsupportedRegion("dynamic hidden size (the normalized last dim must be static)")
    if cols < 1:
        raise UnsupportedRegion("empty normalized axis")
    return cols


def _eps(eps, what) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise UnsupportedRegion(f"{what}: eps {eps!r} is not a constant number")
    eps = float(eps)
    if not (0.0 <= eps < math.inf):
        raise UnsupportedRegion(f"{what}: eps {eps!r} is not finite and >= 0")
    return eps


def _vector(node, what, dtype, cols):
    """An affine parameter: None, or a (cols,) tensor of the input's dtype."""
    if node is None:
        return None
    v = val(node)
    if not isinstance(node, fx.Node) or not isinstance(v, torch.Tensor):
        raise UnsupportedRegion(f"{what} is not a tensor")
    if DTYPE_NAMES.get(v.dtype) != dtype:
        raise UnsupportedRegion(f"{what} dtype {DTYPE_NAMES.get(v.dtype, v.dtype)} differs from "
                                f"the input's ({dtype})")
    if v.dim() != 1 or static_int(v.shape[0]) != cols:
        raise UnsupportedRegion(f"{what} of shape {tuple(v.shape)} is not a ({cols},) vector")
    return node


def _is_one(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and v == 1


def _unit_offset_weight(node, dtype, cols):
    """(weight, the form's nodes [cast], add) when ``node`` is ``1 + weight`` (add.Tensor /
    add.Scalar, alpha 1, either order), the weight a (cols,) vector of the input's dtype,
    cast to fp32 first or not; else None. UnsupportedRegion when it is that form but the
    weight is not a vector the kernel takes (e.g. of another dtype)."""
    if not (isinstance(node, fx.Node) and _call(node, aten.add.Tensor, aten.add.Scalar)
            and len(node.args) == 2 and node.kwargs.get("alpha", 1) == 1):
        return None
    a, b = node.args
    t = a if _is_one(b) else (b if _is_one(a) else None)
    if not isinstance(t, fx.Node) or val(node) is None:
        return None
    if DTYPE_NAMES.get(val(node).dtype) not in ("f32", dtype):
        return None
    cast = _cast_of(t)
    nodes = [node]
    if cast is not None and cast[1] == torch.float32:
        if _users(t) != [node]:
            return None
        t, nodes = cast[0], [t, node]
    return _vector(t, "weight", dtype, cols), nodes


def _last_axis_only(shape, what, cols):
    shape = list(shape)
    if len(shape) != 1:
        raise UnsupportedRegion(f"{what} over the last {len(shape)} axes {shape}: only a norm "
                                "over the last axis is offloaded")
    if static_int(shape[0]) != cols:
        raise UnsupportedRegion(f"{what}: normalized_shape {shape} is not static or not the last dim")


def layer_norm_operands(node, options) -> NormOperands:
    """aten.layer_norm.default(input, normalized_shape, weight, bias, eps, cudnn_enable)."""
    x = node.args[0]
    dtype = tensor_dtype(x, "input")
    cols = _cols(x)
    _last_axis_only(_arg(node, 1, "normalized_shape"), "layer_norm", cols)
    w = _arg(node, 2, "weight")
    offset = _unit_offset_weight(w, dtype, cols)
    if offset is not None and _users(w) == [node]:      # weight + 1 joins the region
        weight, nodes = offset[0], offset[1] + [node]
    else:
        weight, nodes, offset = _vector(w, "weight", dtype, cols), [node], None
    bias = _vector(_arg(node, 3, "bias"), "bias", dtype, cols)
    if bias is not None and weight is None:
        raise UnsupportedRegion("layer_norm with a bias but no weight")
    eps = _eps(_arg(node, 4, "eps"), "layer_norm")
    return NormOperands("layer_norm", "layer_norm", x, cols, dtype, eps, nodes, weight, bias,
                        unit_offset=offset is not None)


def native_layer_norm_operands(node, options) -> NormOperands:
    """aten.native_layer_norm.default (what AOTAutograd produces for the torch.compile
    backend): (out, mean, rstd); offloaded when only ``out`` (getitem 0) is used."""
    ops = layer_norm_operands(node, options)
    outs = [u for u in node.users if u.target is operator.getitem]
    if len(outs) != len(node.users) or any(u.args[1] != 0 for u in outs):
        raise UnsupportedRegion("native_layer_norm: its mean / rstd outputs are used")
    if len(outs) != 1:
        raise UnsupportedRegion("native_layer_norm: its output is read more than once")
    ops.nodes = ops.nodes + [outs[0]]
    return ops


def rms_norm_operands(node, options) -> NormOperands:
    """aten.rms_norm.default(input, normalized_shape, weight, eps)."""
    x = node.args[0]
    dtype = tensor_dtype(x, "input")
    cols = _cols(x)
    _last_axis_only(_arg(node, 1, "normalized_shape"), "rms_norm", cols)
    weight = _vector(_arg(node, 2, "weight"), "weight", dtype, cols)
    eps = _arg(node, 3, "eps")
    if eps is None:
        # PyTorch's default (nn.RMSNorm's eps=None): the epsilon of the computation type,
        # float32 for fp16 / bf16 / fp32 inputs (ATen's rms_norm:
        # numeric_limits<opmath_type<T>>::epsilon(); torch/_decomp/decompositions.py
        # _fused_rms_norm); the dtypes that reach here are those
        eps = torch.finfo(torch.float32).eps
    return NormOperands("rms_norm", "rms_norm", x, cols, dtype, _eps(eps, "rms_norm"), [node], weight)


# ------------------------------------------------------------- the written-out RMS norm

def _other(n, one):
    """The other argument of a binary call n, one of whose arguments is ``one``."""
    a, b = n.args[0], n.args[1]
    return b if a is one else a


def _cast_of(n):
    """(source, dtype) when n is a pure dtype cast (to.dtype / _to_copy / type_as, as
    ``y.type_as(x)`` ends Gemma's RMSNorm), else None."""
    if _call(n, aten.type_as.default) and len(n.args) == 2 and not n.kwargs:
        other = val(n.args[1])
        return (n.args[0], other.dtype) if isinstance(other, torch.Tensor) else None
    if _call(n, aten.to.dtype):
        extra = dict(zip(("non_blocking", "copy", "memory_format"), n.args[2:]), **n.kwargs)
        if any(v not in (None, False, torch.preserve_format) for v in extra.values()):
            return None
        return n.args[0], n.args[1]
    if _call(n, aten._to_copy.default) and len(n.args) == 1:
        kw = dict(n.kwargs)
        dt = kw.pop("dtype", None)
        v = val(n.args[0])
        if dt is None or not isinstance(v, torch.Tensor):
            return None
        if kw.pop("device", v.device) != v.device or kw.pop("layout", torch.strided) != torch.strided:
            return None
        if any(x not in (None, False, torch.preserve_format) for x in kw.values()):
            return None
        return n.args[0], dt
    return None


def _cast_to(n, dtype):
    """n's only user when it is a cast of n to ``dtype``, else None."""
    users = _users(n)
    if len(users) == 1:
        c = _cast_of(users[0])
        if c is not None and c[0] is n and c[1] == dtype:
            return users[0]
    return None


def _square_base(n):
    if _call(n, aten.pow.Tensor_Scalar) and n.args[1] in (2, 2.0):
        return n.args[0]
    if _call(n, aten.mul.Tensor) and len(n.args) == 2 and n.args[0] is n.args[1] and not n.kwargs:
        return n.args[0]
    return None


def _mean_eps(add):
    """(mean node, eps) of ``mean + eps`` (either order; add.Tensor / add.Scalar)."""
    if not _call(add, aten.add.Tensor, aten.add.Scalar) or len(add.args) != 2:
        return None, None
    if add.kwargs.get("alpha", 1) != 1:
        return None, None
    a, b = add.args
    if isinstance(a, fx.Node) and _call(a, aten.mean.dim):
        return a, b
    if isinstance(b, fx.Node) and _call(b, aten.mean.dim):
        return b, a
    return None, None


def _centred(d):
    """(x, mean node) when ``d`` is ``x - mean(x, [-1], keepdim=True)``, else None."""
    if not (isinstance(d, fx.Node) and _call(d, aten.sub.Tensor) and len(d.args) == 2
            and d.kwargs.get("alpha", 1) == 1):
        return None
    x, m = d.args
    if not (isinstance(m, fx.Node) and _call(m, aten.mean.dim) and m.args[0] is x
            and not m.kwargs.get("dtype")):
        return None
    return x, m


def rsqrt_rms_operands(node, options) -> Optional[NormOperands]:
    """The written-out RMS norm anchored at ``rsqrt(mean(x^2, -1, keepdim) + eps)``, or
    the written-out layer norm (Cohere's LayerNorm: ``rsqrt(mean((x - mean(x))^2) + eps)``
    multiplied into ``x - mean(x)``, no bias); None when this rsqrt is neither."""
    add = node.args[0]
    mean, eps = _mean_eps(add)
    if mean is None:
        return None
    sq = mean.args[0]
    xf = _square_base(sq)
    if xf is None or not isinstance(xf, fx.Node) or not isinstance(val(xf), torch.Tensor):
        return None
    centred = _centred(xf)
    what = "layer norm" if centred else "RMS norm"
    # from here on it is a norm: refusals become fallbacks with a reason
    if len(_users(add)) != 1 or len(_users(mean)) != 1 or len(_users(sq)) != 1:
        raise UnsupportedRegion(f"{what}: an intermediate of its statistics is used elsewhere")
    stats = []                            # the centring's nodes (mean(x), x - mean(x))
    if centred:
        stats = [centred[1], xf]
        m = centred[1]
        if _arg(m, 1, "dim") != _arg(mean, 1, "dim") or _arg(m, 2, "keepdim") != _arg(mean, 2, "keepdim"):
            raise UnsupportedRegion(f"{what}: its mean and variance are over different dims")
        xf = centred[0]
    xv = val(xf)
    dims = _arg(mean, 1, "dim")
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    keepdim = _arg(mean, 2, "keepdim")
    if len(dims) != 1 or dims[0] not in (-1, xv.dim() - 1) or not keepdim:
        raise UnsupportedRegion(f"{what} over dims {dims} (keepdim={keepdim}): only the last "
                                "axis with keepdim=True is offloaded")
    if mean.kwargs.get("dtype") is not None:
        raise UnsupportedRegion(f"{what}: mean with a dtype argument")
    eps = _eps(eps, what)
    if xv.dtype != torch.float32:
        raise UnsupportedRegion(f"{what}: statistics in {xv.dtype} (only fp32 statistics are matched)")
    cast = _cast_of(xf)
    x = cast[0] if cast is not None else xf
    if not isinstance(x, fx.Node):
        raise UnsupportedRegion(f"{what}: the input is not a tensor node")
    dtype = tensor_dtype(x, "input")
    cols = _cols(x)
    if _cols(xf) != cols or val(xf).shape != val(x).shape:
        raise UnsupportedRegion(f"{what}: the cast changes the shape")

    r_users = _users(node)
    if len(r_users) != 1 or not _call(r_users[0], aten.mul.Tensor) or len(r_users[0].args) != 2:
        raise UnsupportedRegion(f"{what}: rsqrt(mean(x^2) + eps) is not only multiplied into x")
    norm = r_users[0]
    src = _other(norm, node)
    if centred:
        if src is not stats[1]:
            again = _centred(src)
            if again is None or again != (xf, stats[0]):
                raise UnsupportedRegion(f"{what}: rsqrt(var + eps) multiplies another tensor "
                                        "than x - mean(x)")
            stats.append(src)
    elif src is not xf and src is not x:
        raise UnsupportedRegion(f"{what}: rsqrt(mean(x^2) + eps) multiplies another tensor")
    inner = stats + [sq, mean, add, node, norm]
    if cast is not None:                   # x.to(fp32) joins; x itself may be used anywhere
        if not set(_users(xf)) <= ({stats[0], *stats[1:]} if centred else {sq, norm}):
            raise UnsupportedRegion(f"{what}: x.to({xv.dtype}) is used outside the norm")
        inner.insert(0, xf)
    # the tail: [y.to(x.dtype)] [weight * y] [.to(x.dtype)], ending in x's dtype
    # (AOTAutograd's decomposition of rms_norm multiplies the weight in fp32, then casts)
    xdt, notes, refused = val(x).dtype, [], None
    out = _cast_to(norm, xdt) or norm
    if out is not norm:
        inner.append(out)
    weight, plain = None, (out, len(inner))            # where the region may end without weight
    nxt = _users(out)
    if len(nxt) == 1 and _call(nxt[0], aten.mul.Tensor) and len(nxt[0].args) == 2:
        wmul = nxt[0]
        try:
            offset = _unit_offset_weight(_other(wmul, out), dtype, cols)
            w = _other(wmul, out)
            up = _cast_of(w) if isinstance(w, fx.Node) else None
            if offset is not None:
                weight, offset_nodes = offset
                inner.extend(offset_nodes)
            elif up is not None and up[1] == torch.float32 and _users(w) == [wmul]:
                # weight.to(fp32) * y (Cohere's): the kernel multiplies in fp32 anyway
                weight = _vector(up[0], "weight", dtype, cols)
                inner.append(w)
            else:
                weight = _vector(w, "weight", dtype, cols)
            if tuple(val(wmul).shape) != tuple(val(out).shape):
                raise UnsupportedRegion("weight * y broadcasts to another shape")
            if val(wmul).dtype not in (xdt, torch.float32):
                raise UnsupportedRegion(f"weight * y is {val(wmul).dtype}")
        except UnsupportedRegion as e:
            weight, refused = None, f"{wmul.name}: {e}"
            notes.append(note_not_fused(wmul.name, str(e)))
        if weight is not None:
            out = wmul
            inner.append(out)
            last = _cast_to(out, xdt)
            if last is not None:
                out = last
                inner.append(out)
            if val(out).dtype != xdt:                  # the weight made it fp32 for good
                notes.append(note_not_fused(wmul.name, f"weight * y stays {val(out).dtype}"))
                weight, (out, keep) = None, plain
                del inner[keep:]
    elif len(nxt) > 1:
        notes.append(note_stops("norm", out.name, len(nxt)))
    if val(out).dtype != xdt:
        if refused is not None:     # e.g. Gemma's x_norm * (1 + w.float()), cast back after it
            raise UnsupportedRegion(f"{what}: the normalized x is multiplied in {val(out).dtype} "
                                    f"by what is not a weight vector the kernel takes ({refused}) "
                                    "before the cast back")
        raise UnsupportedRegion(f"{what}: the result is {val(out).dtype}, the input {xdt}")
    # metadata checks on intermediates join the region; the output's stay outside
    members = set(inner)
    for n in inner[:-1]:
        members.update(_checks(n))
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    nodes = sorted(members, key=order.__getitem__)
    if nodes[-1] is not out:
        raise UnsupportedRegion(f"{what}: a node of the form comes after its output")
    for n in nodes[:-1]:
        if not set(n.users) <= members:
            raise UnsupportedRegion(f"{what}: intermediate {n.name} is used outside the norm")
    form, kind = ("layer_norm_decomposed", "layer_norm") if centred else ("rms_norm_decomposed", "rms_norm")
    return NormOperands(form, kind, x, cols, dtype, eps, nodes, weight,
                        notes=notes, unit_offset=weight is not None and offset is not None)


def make_norm_region(index: int, ops: NormOperands) -> NormRegion:
    """The NormRegion of a matched norm (ValueError for an impossible problem)."""
    lead = val(ops.x).shape[:-1]
    static = [static_int(d) for d in lead]
    rows = None if any(s is None for s in static) else int(math.prod(static))
    rows_hint = max(1, int(math.prod(hint_int(d) for d in lead)))
    problem = NormProblem(kind=ops.kind, dtype=ops.dtype, cols=ops.cols, eps=ops.eps,
                          align=max_alignment(ops.cols, ops.dtype), weight=ops.weight is not None,
                          bias=ops.bias is not None, rows=rows, rows_hint=rows_hint,
                          unit_offset=ops.unit_offset)
    return NormRegion(name=f"region{index}_{ops.form}", form=ops.form,
                      nodes=tuple(n.name for n in ops.nodes), x=ops.x.name, problem=problem,
                      weight=ops.weight.name if ops.weight is not None else None,
                      bias=ops.bias.name if ops.bias is not None else None, notes=tuple(ops.notes))


def left_to_glue(group: bool, options) -> str | None:
    """Why a norm stays in the graph by choice (``options.offload_norms``), or None.
    ``group``: a group norm (kept as a region under "group")."""
    norms = options.offload_norms
    if norms == "none" or (norms == "group" and not group):
        why = ("what 'auto' picks with Inductor glue" if norms == "group" else "as set")
        return (f"left to the glue by choice: Inductor fuses a norm with its neighbours, which "
                f"a region would prevent (offload_norms={norms!r}, {why}; --norms all / "
                "offload_norms='all' offloads it)")
    return None


def norm_maker(group: bool, make_region):
    """The pattern table's region maker of a norm kind (no epilogue growth):
    (index, node, operands, options, taken) -> (region, its nodes). Raises
    UnsupportedRegion when the norm is left to the glue (``left_to_glue``) or
    overlaps another region, ValueError (from ``make_region``) for an impossible
    problem."""
    def make(index, node, ops, options, taken) -> tuple:
        why = left_to_glue(group, options)
        if why:
            raise LeftByChoice(why)
        if any(n in taken for n in ops.nodes):
            raise UnsupportedRegion("overlaps another region")
        return make_region(index, ops), ops.nodes
    return make


make_norm = norm_maker(False, make_norm_region)
