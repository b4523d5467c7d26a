"""Sibling linears combined into one GEMM (TVM's CombineParallelDense, for our regions).

Attention's q / k / v projections, and the key / value projections of a cross
attention, are linears that read the same input with weights of their own. Run
one by one they are three narrow GEMMs: three launches, and grids that fill the
SMs' waves badly (llama's k and v are 2048x256x2048 each: 128 CTAs of 64x64).
Combined, they are one GEMM over the concatenated weights, N the sum of theirs,
and each member's output is a slice of its output (a view: no copy).

Only members too small to fill the GPU alone join: fewer 128x128 output tiles than
the target has SMs (``UNDER_FILLED``). Measured on the H200 (runtime.py A/B, same
machine, ms per forward, reduce-overhead / CUDA graph of eager glue): combining
every sibling made bert-base (1024 tokens: 48 tiles per projection) faster, 1.20
-> 1.05 / 0.849 -> 0.738, but whisper-encoder (6000 tokens: 282 tiles) slower,
4.18 -> 4.27 / 4.250 -> 4.409, and llama (2048 tokens; q: 256 tiles) 6.38 -> 6.45 /
7.396 -> 7.505 (runtime_ab_*_2026-12-01_h200.*): a GEMM that already fills its
waves gains nothing from a wider N and pays for strided slices in the glue.

``combine_parallel_linears(gm, regions)`` rewrites ``gm`` after a first partition
(partition/__init__.py runs the partition again on the rewritten graph). A group
is two or more GEMM regions that

* are a plain ``aten.linear`` with nothing fused, or a bias only: a fused
  activation or residual would be cut off by the slice and run in the glue;
* read the same input node, with 2-D module-constant (``get_attr``) weights of one
  dtype, device and K, and constant biases or none;
* each have N a multiple of 8, so every slice starts 16 bytes into a row whose
  length is a multiple of 16 bytes (what TMA and the attention kernel's reads need);
* each fill less than a wave of 128x128 tiles at the example size.

The rewrite registers the concatenated weight (and bias: zeros for a member without
one, exact since x + 0.0 == x) on ``gm`` as buffers ``_co_combined_<i>_weight`` /
``_bias``, adds one ``aten.linear`` before the first member and an
``aten.slice.Tensor`` over the last dim per member, and lets the members' users
read the slices. The combined weights are a copy: the members' parameters stay in
the user's module, unused by the offloaded graph, and a later change to them is
not seen by the combined GEMM (as with folded batch norms, canonicalize.py).
``CompileOptions.combine_gemms=False`` leaves every linear as it is.
"""
from __future__ import annotations

import collections
import math

import torch
import torch.fx as fx

from ..ir import GemmRegion
from .graph_utils import aten, attr_tensor, fake_like, is_call, metadata_checks

ALIGN = 8            # elements: every member's N, so each slice is 16-byte aligned (16-bit types)
UNDER_FILLED = (128, 128)   # a member joins with fewer output tiles of this shape than SMs
PREFIX = "_co_combined_"


def _member(gm: fx.GraphModule, region, nodes: dict, num_sms: int):
    """(linear node, input node, weight, bias or None) of a region that may join a
    group, else None."""
    if not isinstance(region, GemmRegion) or region.form != "linear" \
            or region.problem.epilogue.tag not in ("plain", "bias"):
        return None
    tm, tn = UNDER_FILLED
    if math.ceil(region.problem.rows / tm) * math.ceil(region.problem.n / tn) >= num_sms:
        return None             # it fills the GPU alone (module docstring: measured)
    lin = nodes.get(region.nodes[0])
    if not is_call(lin, aten.linear.default) or metadata_checks(lin):
        return None         # a check torch.export put on the output may pin its strides
    x, w_node = lin.args[0], lin.args[1]
    b_node = lin.args[2] if len(lin.args) > 2 else lin.kwargs.get("bias")
    w = attr_tensor(gm, w_node)
    b = attr_tensor(gm, b_node) if b_node is not None else None
    if w is None or w.dim() != 2 or w.shape[0] % ALIGN or (b_node is not None and b is None):
        return None
    if b is not None and (b.dim() != 1 or b.shape[0] != w.shape[0] or b.dtype != w.dtype):
        return None
    if getattr(x.meta.get("val"), "fake_mode", None) is None:
        return None
    return lin, x, w, b


def combine_parallel_linears(gm: fx.GraphModule, regions, num_sms: int) -> list:
    """Rewrite each group of sibling linear regions (module docstring) of ``gm``
    into one linear and slices, in place; ``num_sms``: the target's SM count.
    Returns [(combined node name, [member linear names])], empty when nothing was
    combined (``gm`` untouched then)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    groups = collections.defaultdict(list)
    for r in regions:
        m = _member(gm, r, nodes, num_sms)
        if m is not None:
            lin, x, w, _ = m
            groups[(x, w.dtype, w.device, w.shape[1])].append(m)
    done = []
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort(key=lambda m: order[m[0]])
        done.append(_rewrite(gm, members, len(done)))
    if done:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return done


def _rewrite(gm: fx.GraphModule, members: list, index: int) -> tuple:
    graph = gm.graph
    first, x = members[0][0], members[0][1]
    with torch.no_grad():
        w_cat = torch.cat([w.detach() for _, _, w, _ in members]).contiguous()
        has_bias = any(b is not None for *_, b in members)
        b_cat = torch.cat([b.detach() if b is not None else w.new_zeros(w.shape[0])
                           for _, _, w, b in members]) if has_bias else None
    # every new node's FakeTensor first, so a failure leaves the graph as it was. No
    # op runs on the symbolic input: the linear's decomposition can guard on (and so
    # specialize) a dynamic batch; a fresh tensor of its shape and a slice of the
    # static last dim cannot.
    xv = x.meta["val"]
    wv = fake_like(xv, w_cat)
    bv = fake_like(xv, b_cat) if has_bias else None
    with xv.fake_mode:
        out = xv.new_empty((*xv.shape[:-1], w_cat.shape[0]))
        bounds, off = [], 0
        for _, _, w, _ in members:
            bounds.append((off, off + w.shape[0]))
            off += w.shape[0]
        slices = [aten.slice.Tensor(out, -1, lo, hi) for lo, hi in bounds]
    w_name, b_name = f"{PREFIX}{index}_weight", f"{PREFIX}{index}_bias"
    gm.register_buffer(w_name, w_cat)
    if has_bias:
        gm.register_buffer(b_name, b_cat)
    with graph.inserting_before(first):
        w_node = graph.get_attr(w_name)
        w_node.meta["val"] = wv
        args = (x, w_node)
        if has_bias:
            b_node = graph.get_attr(b_name)
            b_node.meta["val"] = bv
            args += (b_node,)
        combined = graph.call_function(aten.linear.default, args)
        combined.meta["val"] = out
        for (lin, *_), (lo, hi), sv in zip(members, bounds, slices):
            sl = graph.call_function(aten.slice.Tensor, (combined, -1, lo, hi))
            sl.meta["val"] = sv
            lin.replace_all_uses_with(sl)
    names = [lin.name for lin, *_ in members]
    for lin, *_ in members:
        graph.erase_node(lin)
    return combined.name, names
