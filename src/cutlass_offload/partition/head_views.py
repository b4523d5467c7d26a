"""Attention written on (B * H, L, D) batches, its scores viewed as (B, H, L, S) for
the softmax, as one 4-D attention (a canonicalize rewrite).

transformers' BLOOM (and fairseq-style attention) runs both GEMMs as 3-D ``bmm`` over
a batch of B * H heads and views the scores to (B, H, L, S) only around the softmax,
where a (B, 1, L, S) mask broadcasts over heads::

    s = baddbmm(alibi, q3, k3^T, alpha=c)       # (B * H, L, S); canonicalize made it
                                                # c * bmm(q3, k3^T) + alibi
    p = softmax(s.view(B, H, L, S) + mask, -1, dtype=float32).to(fp16)
    o3 = bmm(p.view(B * H, L, S), v3)            # (B * H, L, D)

The attention matcher walks from the softmax back to q @ k^T through scalings,
casts and adds only, so this stayed two batched GEMMs and a softmax. Here the
view moves to the operands instead::

    s = c * matmul(q4, k4^T) + alibi.unflatten(0, (B, H))     # (B, H, L, S)
    p = softmax(s + mask, -1, dtype=float32).to(fp16)
    o3 = matmul(p, v4).flatten(0, 1)      # a view of it back to (B, H, L, D) reads matmul(p, v4)

which is the same math, element for element (splitting dim 0 is a view of any
tensor, so nothing is copied; each op rounds as before). An operand that is itself
``reshape(x4, (B * H, L, D))`` of a (B, H, L, D) tensor (BLOOM's q, k and v: a copy
of a strided view of the fused QKV projection) is replaced by ``x4``, so the kernel
reads it where it lies and the copy goes. Rewritten only where the whole form is
there: the scores' bmm, a chain of scalings, casts and adds with one user each up to
the split view, a softmax after it, and the merge view read only by the second bmm.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .graph_utils import (aten, fake_value, is_call, metadata_checks, same_dim, same_shape,
                          static_int, users, val)

_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_SOFTMAX = (aten._softmax.default, aten.softmax.int)
# ops between the scores' bmm and the split view that move to 4-D unchanged:
# elementwise with a scalar or a broadcast tensor, and casts
_ELEMENTWISE = (aten.mul.Tensor, aten.div.Tensor, aten.add.Tensor, aten.sub.Tensor,
                aten.to.dtype, aten._to_copy.default)
_MAX_CHAIN = 8            # ops between the bmm and the view, and between the view and softmax


def _new(graph: fx.Graph, target, args, like: fx.Node | None = None) -> fx.Node:
    n = graph.call_function(target, tuple(args))
    n.meta["val"] = fake_value(target, fx.node.map_arg(args, val))
    if like is not None:
        n.meta.update({k: v for k, v in like.meta.items() if k in ("stack_trace", "nn_module_stack")})
    return n


def _split(v: fx.Node):
    """(B, H) arguments of a view splitting dim 0 of a rank-3 tensor into two, else None."""
    if not is_call(v, *_VIEWS) or not isinstance(v.args[0], fx.Node):
        return None
    src, out = val(v.args[0]), val(v)
    if not (isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor)):
        return None
    if src.dim() != 3 or out.dim() != 4 or not same_shape(out.shape[2:], src.shape[1:]):
        return None
    sizes = list(v.args[1])[:2]
    if any(isinstance(s, int) and s == -1 for s in sizes):
        # worked out from a static shape; a -1 for a dynamic batch (DeBERTa's view(-1, H,
        # L, S) under dynamic_batch) is None: the rows // H (_batch_of), so H stays static
        static = [static_int(d) for d in out.shape[:2]]
        if isinstance(sizes[1], int) and sizes[1] > 0:      # H as the view gives it
            static[1] = sizes[1]
        if static[0] is None and static[1] is not None:
            return [None, static[1]]          # split_head_batches makes the batch node
        sizes = static
    return sizes if all(isinstance(s, (int, fx.Node)) for s in sizes) else None


def _batch_of(graph: fx.Graph, rows_of: fx.Node, heads: int) -> fx.Node:
    """A node of ``rows_of.shape[0] // heads`` (the dynamic B of a (B * H, ...) tensor)."""
    rows = _new(graph, aten.sym_size.int, (rows_of, 0))
    batch = graph.call_function(operator.floordiv, (rows, heads))
    batch.meta["val"] = val(rows) // heads
    return batch


def _merges(v: fx.Node, shape4) -> bool:
    """``v`` views a (B, H, L, S) tensor of ``shape4`` as (B * H, L, S)."""
    if not is_call(v, *_VIEWS):
        return False
    out = val(v)
    return (isinstance(out, torch.Tensor) and out.dim() == 3 and same_shape(out.shape[1:], shape4[2:])
            and same_dim(out.shape[0], shape4[0] * shape4[1]))


def _chain_up(view: fx.Node):
    """(bmm, the ops from it to ``view`` in order) when only elementwise ops with one
    user each lie between a 3-D bmm and ``view``, else None."""
    chain, n = [], view.args[0]
    for _ in range(_MAX_CHAIN + 1):
        if len(users(n)) != 1:
            return None
        if is_call(n, aten.bmm.default):
            return n, chain[::-1]
        if not is_call(n, *_ELEMENTWISE) or not isinstance(n.args[0], fx.Node):
            return None
        chain.append(n)
        tensors = [a for a in n.args if isinstance(a, fx.Node)]
        # the scores are the operand of the scores' shape; a second such operand (a
        # full bias) must come from elsewhere: follow the first that leads to a bmm
        n = next((a for a in tensors if same_shape(val(a).shape, val(n).shape)
                  and _leads_to_bmm(a)), None)
        if n is None:
            return None
    return None


def _leads_to_bmm(n, depth=_MAX_CHAIN) -> bool:
    while depth > 0 and isinstance(n, fx.Node):
        if is_call(n, aten.bmm.default):
            return True
        if not is_call(n, *_ELEMENTWISE):
            return False
        n, depth = n.args[0], depth - 1
    return False


def _merge_after_softmax(view: fx.Node):
    """The view merging (B, H) back that the second bmm reads, when a softmax follows
    ``view`` through ops with one user each; else None."""
    n, softmax = view, False
    shape4 = val(view).shape
    for _ in range(2 * _MAX_CHAIN):
        nxt = users(n)
        if len(nxt) != 1:
            return None
        n = nxt[0]
        if _merges(n, shape4):
            bmm = users(n)
            ok = softmax and len(bmm) == 1 and is_call(bmm[0], aten.bmm.default) and bmm[0].args[0] is n
            return n if ok else None
        if n.op != "call_function" or not isinstance(val(n), torch.Tensor) \
                or not same_shape(val(n).shape, shape4):
            return None
        softmax = softmax or is_call(n, *_SOFTMAX)
    return None


def _lift(graph: fx.Graph, n: fx.Node, bh) -> fx.Node:
    """A (B, H, ...) node equal to ``n`` (B * H, ...) split at dim 0: the 4-D tensor it
    was reshaped from, a transpose of the last two dims moved above the split, or
    ``n.unflatten(0, (B, H))`` (a view)."""
    nv = val(n)
    if is_call(n, aten.transpose.int) and sorted(d % nv.dim() for d in n.args[1:3]) == [1, 2]:
        return _new(graph, aten.transpose.int, (_lift(graph, n.args[0], bh), -1, -2), like=n)
    if is_call(n, *_VIEWS) and isinstance(n.args[0], fx.Node):
        src = val(n.args[0])
        if (isinstance(src, torch.Tensor) and src.dim() == 4 and same_shape(src.shape[2:], nv.shape[1:])
                and same_shape(src.shape[:2], [val(b) if isinstance(b, fx.Node) else b for b in bh])):
            return n.args[0]
    out = _new(graph, aten.unflatten.int, (n, 0, list(bh)), like=n)
    heads = bh[1]
    if isinstance(heads, int) and static_int(val(out).shape[1]) is None:
        # a dynamic B * H split by a static H: the fake op spells H as rows // (rows // H),
        # which is H for every size the model's own view accepts (rows a multiple of H)
        v, mode = val(out), getattr(val(out), "fake_mode", None)
        if mode is not None:
            shape = [v.shape[0], heads] + list(v.shape[2:])
            stride = [v.stride(0), nv.stride(0)] + list(v.stride()[2:])
            with mode:
                out.meta["val"] = torch.empty_strided(shape, stride, dtype=v.dtype, device=v.device)
    return out


def _lift_operand(graph: fx.Graph, a, scores3, bh):
    """An operand of an op in the chain, for its 4-D form: a scalar as it is, the
    scores (the chain's previous node) by ``done``, a tensor broadcast over dim 0 (or of
    lower rank) as it is (it broadcasts the same against (B, H, ...)), one with B * H
    entries split; None for anything else."""
    if not isinstance(a, fx.Node):
        return a
    av = val(a)
    if not isinstance(av, torch.Tensor):
        return None
    if av.dim() < scores3.dim() or (av.dim() == scores3.dim() and static_int(av.shape[0]) == 1):
        return a
    if av.dim() == scores3.dim() and same_dim(av.shape[0], scores3.shape[0]):
        return _lift(graph, a, bh)
    return None


def split_head_batches(graph: fx.Graph) -> int:
    """Rewrite every (B * H) attention of the module docstring into its 4-D form;
    returns how many. Every new node gets its ``meta['val']``; the old ones are
    erased where unused."""
    done = 0
    for view in list(graph.nodes):
        bh = _split(view)
        if bh is None:
            continue
        up = _chain_up(view)
        merge = _merge_after_softmax(view) if up is not None else None
        if merge is None:
            continue
        bmm1, chain = up
        bmm2 = users(merge)[0]
        before = view.prev                      # the new nodes go between it and the view
        with graph.inserting_before(view):
            if bh[0] is None:
                bh = [_batch_of(graph, bmm1.args[0], bh[1]), bh[1]]
            q4, k4 = (_lift(graph, a, bh) for a in bmm1.args)
            cur, prev = _new(graph, aten.matmul.default, (q4, k4), like=bmm1), bmm1
            for op in chain:
                args = tuple(cur if a is prev else _lift_operand(graph, a, val(prev), bh)
                             for a in op.args)
                if any(a is None for a in args):
                    cur = None
                    break
                cur = graph.call_function(op.target, args, dict(op.kwargs))
                cur.meta["val"] = fake_value(op.target, fx.node.map_arg(args, val), op.kwargs)
                prev = op
        # the leading two dims are the split itself (torch.export may spell a dynamic one
        # as s // (s // H) where the rewrite has H)
        if cur is None or not same_shape(val(cur).shape[2:], val(view).shape[2:]) \
                or val(cur).dtype != val(view).dtype:
            while view.prev is not before:      # the new nodes, unused
                graph.erase_node(view.prev)
            continue
        view.replace_all_uses_with(cur)
        with graph.inserting_before(bmm2):
            v4 = _lift(graph, bmm2.args[1], bh)
            out4 = _new(graph, aten.matmul.default, (merge.args[0], v4), like=bmm2)
            out3 = _new(graph, aten.flatten.using_ints, (out4, 0, 1), like=bmm2)
        bmm2.replace_all_uses_with(out3)
        # BLOOM views the output straight back to (B, H, L, D): that is out4 itself, so
        # the region's output layout can take the permute after it (attention_forms'
        # _absorb_output) instead of a copy in the glue
        for u in users(out3):
            if is_call(u, *_VIEWS) and same_shape(val(u).shape, val(out4).shape):
                u.replace_all_uses_with(out4)
                graph.erase_node(u)
        for old in [bmm2, merge, view] + chain[::-1] + [bmm1]:
            for check in metadata_checks(old):
                graph.erase_node(check)
            if not old.users:
                graph.erase_node(old)
        done += 1
    return done


def drop_same_shape_views(graph: fx.Graph) -> int:
    """``x.view(x.shape)`` (or reshape) -> ``x``: a view to the shape a tensor already
    has is that tensor (BLOOM's ``p.view(B * H, L, S)`` of a (B * H, L, S) softmax
    stood between it and ``@ v``); returns how many. Only on computed tensors."""
    done = 0
    for n in list(graph.nodes):
        if not is_call(n, *_VIEWS) or not isinstance(n.args[0], fx.Node) or n.args[0].op != "call_function":
            continue
        src, out = val(n.args[0]), val(n)
        if isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor) and same_shape(src.shape, out.shape):
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)
            done += 1
    return done
