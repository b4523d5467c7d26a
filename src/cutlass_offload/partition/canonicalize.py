"""Graph rewrites that expose fusible GEMM epilogues, applied before matching.

* drop eval-mode dropout (identity);
* turn the hand-written tanh GELU (GPT-2's ``NewGELUActivation``) into
  ``aten.gelu(approximate="tanh")``;
* sink a reshape that sits between a 2-D GEMM and its elementwise epilogue below
  that epilogue (``view(mm) + r`` -> ``view(mm + r.reshape(-1, N))``), which is
  the form ``Conv1D``/``addmm`` and AOTAutograd graphs take.

Every rewrite keeps ``meta['val']`` valid (recomputed with the graph's FakeTensor
mode) so later stages can read shapes.
"""
from __future__ import annotations

import math

import torch.fx as fx

from .graph_utils import aten, val

_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_UNARY = (aten.relu.default, aten.gelu.default, aten.silu.default, aten.sigmoid.default)
_BINARY = (aten.add.Tensor, aten.mul.Tensor)
_GEMMS = (aten.addmm.default, aten.mm.default, aten.linear.default, aten.matmul.default)


def canonicalize(gm: fx.GraphModule) -> fx.GraphModule:
    """Apply all rewrites in place; returns gm (recompiled)."""
    _drop_eval_dropout(gm.graph)
    _fuse_tanh_gelu(gm.graph)
    while _sink_views(gm.graph):
        pass
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _drop_eval_dropout(graph: fx.Graph):
    for n in list(graph.nodes):
        if n.op == "call_function" and n.target is aten.dropout.default:
            train = n.args[2] if len(n.args) > 2 else n.kwargs.get("train", False)
            if train is False:
                n.replace_all_uses_with(n.args[0])
                graph.erase_node(n)


def _is_call(n, target) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target is target


def _const_arg(n, other):
    """The non-node argument of a binary node whose other argument is `other`."""
    a, b = n.args[0], n.args[1]
    if a is other and not isinstance(b, fx.Node):
        return b
    if b is other and not isinstance(a, fx.Node):
        return a
    return None


def _close(x, y) -> bool:
    return isinstance(x, (int, float)) and math.isclose(float(x), y, rel_tol=1e-6)


def _fuse_tanh_gelu(graph: fx.Graph):
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))) -> gelu(x, tanh)."""
    for t in list(graph.nodes):
        if not _is_call(t, aten.tanh.default):
            continue
        inner = t.args[0]                       # sqrt(2/pi) * (x + c*x^3)
        if not _is_call(inner, aten.mul.Tensor):
            continue
        s = next((a for a in inner.args if isinstance(a, fx.Node)), None)
        if s is None or not _close(_const_arg(inner, s), math.sqrt(2.0 / math.pi)):
            continue
        if not _is_call(s, aten.add.Tensor):
            continue
        x, cube = s.args[0], s.args[1]
        if not (_is_call(cube, aten.mul.Tensor) and _close(_const_arg(cube, _first_node(cube)), 0.044715)):
            x, cube = cube, x
            if not (_is_call(cube, aten.mul.Tensor) and _close(_const_arg(cube, _first_node(cube)), 0.044715)):
                continue
        p = _first_node(cube)
        if not (_is_call(p, aten.pow.Tensor_Scalar) and p.args[0] is x and _close(p.args[1], 3.0)):
            continue
        if len(t.users) != 1:
            continue
        one = next(iter(t.users))                # 1 + tanh
        if not (_is_call(one, aten.add.Tensor) and _close(_const_arg(one, t), 1.0)) or len(one.users) != 1:
            continue
        out = next(iter(one.users))              # (0.5 * x) * (1 + tanh)
        if not _is_call(out, aten.mul.Tensor):
            continue
        half = out.args[0] if out.args[1] is one else out.args[1]
        if not (_is_call(half, aten.mul.Tensor) and _first_node(half) is x and _close(_const_arg(half, x), 0.5)):
            continue
        with graph.inserting_before(out):
            g = graph.call_function(aten.gelu.default, (x,), {"approximate": "tanh"})
        g.meta["val"] = val(out)
        out.replace_all_uses_with(g)
        graph.erase_node(out)
    graph.eliminate_dead_code()


def _first_node(n):
    return next((a for a in n.args if isinstance(a, fx.Node)), None)


def _fake_mode(v):
    return getattr(v, "fake_mode", None)


def _sink_views(graph: fx.Graph) -> bool:
    changed = False
    for v in list(graph.nodes):
        if not (v.op == "call_function" and v.target in _VIEWS and len(v.users) == 1):
            continue
        src = v.args[0]
        if not (isinstance(src, fx.Node) and src.op == "call_function"
                and (src.target in _GEMMS or src.target in _UNARY or src.target in _BINARY)):
            continue
        sv, vv = val(src), val(v)
        if sv is None or vv is None or sv.dim() != 2 or vv.dim() < 1 or str(sv.shape[-1]) != str(vv.shape[-1]):
            continue
        u = next(iter(v.users))
        if u.op != "call_function" or len(u.args) < 1:
            continue
        mode = _fake_mode(sv)
        if mode is None:
            continue
        n_cols = sv.shape[-1]
        if u.target in _UNARY and u.args[0] is v:
            new_args = (src,) + tuple(u.args[1:])
        elif u.target in _BINARY and len(u.args) == 2 and v in u.args and not u.kwargs:
            other = u.args[1] if u.args[0] is v else u.args[0]
            ov = val(other) if isinstance(other, fx.Node) else None
            if isinstance(other, fx.Node):
                if ov is None or ov.dtype != sv.dtype:
                    continue
                if ov.dim() == 1 and str(ov.shape[0]) == str(n_cols):
                    pass  # a column vector broadcasts the same way before and after
                elif ov.dim() == vv.dim() and all(str(a) == str(b) for a, b in zip(ov.shape, vv.shape)):
                    with graph.inserting_before(u):
                        other = graph.call_function(aten.reshape.default, (other, [-1, n_cols]))
                    with mode:
                        other.meta["val"] = aten.reshape.default(ov, [-1, n_cols])
                else:
                    continue
            elif not isinstance(other, (int, float)):
                continue
            new_args = (src, other) if u.args[0] is v else (other, src)
        else:
            continue
        with graph.inserting_before(u):
            nu = graph.call_function(u.target, new_args, dict(u.kwargs))
            nv = graph.call_function(v.target, (nu,) + tuple(v.args[1:]), dict(v.kwargs))
        with mode:
            nu.meta["val"] = u.target(*[val(a) if isinstance(a, fx.Node) else a for a in new_args], **u.kwargs)
        nv.meta["val"] = val(u)
        u.replace_all_uses_with(nv)
        graph.erase_node(u)
        graph.erase_node(v)
        changed = True
    return changed
