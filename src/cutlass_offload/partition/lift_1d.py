"""1-D forms lifted to their 2-D ones over a height of 1, so they partition (and
fuse) like them: conv1d as a conv2d, a 3-D group_norm as a 4-D one.

``aten.conv1d(x (N, C, L), w (K, C/g, R), b, [s], [p], [d], g)`` becomes
``squeeze(conv2d(unsqueeze(x, 2), w4, b, [1, s], [0, p], [1, d], g), 2)``: the
same arithmetic over (N, C, 1, L) with a (K, C/g, 1, R) filter (padding strings
"same" / "valid" carry over: on a height of 1 with a 1-tall filter they add no
rows). A filter the module holds (``get_attr``) gets a 4-D buffer of its own,
``_co_conv1d_<n>`` (a view of the parameter; the conv region repacks it once);
any other filter is unsqueezed in the graph. Then, so that the elementwise ops a
model applies after the conv reach its epilogue, the ``squeeze`` is moved below
the unary activations that follow it (``gelu(squeeze(y)) = squeeze(gelu(y))``),
and ``unsqueeze(squeeze(t, 2), 2)``, where a conv1d feeds the next, becomes ``t``.
Whisper's encoder stem (two conv1d + GELU, 25.7 GFLOP at 4 x 3000 frames) is the
model this is for. Unbatched (2-D) inputs are left alone.

``group_norm`` on a 3-D (N, C, L) input is lifted the same way
(``group_norm_3d_as_4d``): its statistics run over C / G channels x L positions,
which are those of (N, C, 1, L). The VAE's attention normalizes its (B, HW, C)
tokens as ``group_norm(x.transpose(1, 2))``, whose (N, C, 1, L) view is already
channels_last: the NHWC group norm kernel reads it in place.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .graph_utils import attr_tensor, aten, fake_value, is_call, users, val
from .graph_utils import call_with_val as _call

_CONV1D = (aten.conv1d.default, aten.conv1d.padding)
# elementwise ops whose output has their input's shape (the epilogue activations)
_UNARY = (aten.relu.default, aten.gelu.default, aten.silu.default, aten.sigmoid.default,
          aten.tanh.default)


def conv1d_as_conv2d(gm: fx.GraphModule) -> bool:
    """Rewrite every batched conv1d of ``gm`` in place (see the module docstring);
    True when something changed. ``meta['val']`` stays valid on every new node."""
    graph, changed = gm.graph, False
    for n in list(graph.nodes):
        if not (is_call(n, *_CONV1D) and _batched(n)):
            continue
        x, w = n.args[0], n.args[1]
        no_pad = [0] if n.target is aten.conv1d.default else "valid"
        bias, stride, padding, dilation, groups = (
            _arg(n, 2, "bias", None), _arg(n, 3, "stride", [1]), _arg(n, 4, "padding", no_pad),
            _arg(n, 5, "dilation", [1]), _arg(n, 6, "groups", 1))
        with graph.inserting_before(n):
            x4 = _call(graph, aten.unsqueeze.default, (x, 2))
            w4 = _filter(gm, w)
            pad = padding if isinstance(padding, str) else [0, _one(padding)]
            target = aten.conv2d.padding if isinstance(padding, str) else aten.conv2d.default
            y4 = _call(graph, target, (x4, w4, bias, [1, _one(stride)], pad, [1, _one(dilation)], groups))
            y = _call(graph, aten.squeeze.dim, (y4, 2))
        _swap(graph, n, y)
        changed = True
    if changed:
        _drop_unsqueeze_of_squeeze(graph)
        graph.eliminate_dead_code()
        gm.recompile()
    return changed


def group_norm_3d_as_4d(gm: fx.GraphModule) -> bool:
    """``group_norm(x (N, C, L), G, w, b, eps)`` -> ``squeeze(group_norm(unsqueeze(x, 2),
    ...), 2)``, the squeeze moved below a SiLU that follows; True when something
    changed."""
    graph, changed = gm.graph, False
    for n in list(graph.nodes):
        if not (is_call(n, aten.group_norm.default) and _batched(n)):
            continue
        with graph.inserting_before(n):
            x4 = _call(graph, aten.unsqueeze.default, (n.args[0], 2))
            y4 = _call(graph, aten.group_norm.default, (x4,) + tuple(n.args[1:]), n.kwargs)
            y = _call(graph, aten.squeeze.dim, (y4, 2))
        _swap(graph, n, y)
        changed = True
    if changed:
        graph.eliminate_dead_code()
        gm.recompile()
    return changed


def _swap(graph, n, y) -> None:
    """Replace the 3-D call ``n`` by the lifted result ``y`` (a squeeze), and move the
    squeeze below a SiLU that follows."""
    n.replace_all_uses_with(y)
    graph.erase_node(n)
    _sink_squeeze(graph, y)


def _batched(n) -> bool:
    """Whether the call's first argument is a 3-D (N, C, L) tensor."""
    v = val(n.args[0])
    return isinstance(v, torch.Tensor) and v.dim() == 3


def _arg(node, i, name, default):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _one(v):
    return v[0] if isinstance(v, (list, tuple)) else v


def _filter(gm: fx.GraphModule, w):
    """The (K, C/g, 1, R) filter: a buffer of the module for a constant one."""
    t = attr_tensor(gm, w)
    if t is None:
        return _call(gm.graph, aten.unsqueeze.default, (w, 2))
    i = 0
    while hasattr(gm, f"_co_conv1d_{i}"):
        i += 1
    name = f"_co_conv1d_{i}"
    gm.register_buffer(name, t.detach().unsqueeze(2))
    node = gm.graph.get_attr(name)
    v = fake_value(aten.unsqueeze.default, (w, 2))
    if v is not None:
        node.meta["val"] = v
    return node


def _sink_squeeze(graph: fx.Graph, sq: fx.Node) -> None:
    """squeeze(y4) -> act -> ... becomes act(y4) -> ... -> squeeze, one unary op at a
    time, while the squeeze's only reader is such an op."""
    while True:
        readers = users(sq)
        if len(readers) != 1 or len(sq.users) != 1:
            return
        u = readers[0]
        if not (is_call(u, *_UNARY) and u.args[0] is sq and all(not isinstance(a, fx.Node)
                                                                  for a in u.args[1:])):
            return
        y4 = sq.args[0]
        with graph.inserting_before(u):
            act = _call(graph, u.target, (y4,) + tuple(u.args[1:]), u.kwargs)
            new_sq = _call(graph, aten.squeeze.dim, (act, 2))
        u.replace_all_uses_with(new_sq)
        graph.erase_node(u)
        graph.erase_node(sq)
        sq = new_sq


def _drop_unsqueeze_of_squeeze(graph: fx.Graph) -> None:
    for n in list(graph.nodes):
        if is_call(n, aten.unsqueeze.default) and n.args[1] == 2 and is_call(n.args[0], aten.squeeze.dim) \
                and n.args[0].args[1] == 2:
            n.replace_all_uses_with(n.args[0].args[0])
            graph.erase_node(n)
