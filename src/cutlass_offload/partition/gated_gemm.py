"""Gated linear units as one GEMM: ``act(x @ Wg^T + bg) * (x @ Wu^T + bu)``.

LLaMA's MLP (SwiGLU) and Gemma's (GEGLU, tanh-GELU) compute a gate and an up
projection of the same input and multiply them. Partitioned op by op, that is
two GEMMs: the up projection plain, the gate with the activation and the
product fused (its epilogue reads the up projection back as C). On the H200,
llama's 2048 x 5632 x 2048 pair took 67.6 us (plain) + 82.3 us (SiLU-multiply,
reading C) in the session-22 corpus run (kernels_fitted_2026-12-03_h200.json),
and the up projection's output, 23 MB, goes to memory and back.

Here the pair becomes one GEMM over both weights, interleaved in blocks of 8 rows
(``interleave``), whose epilogue multiplies each column's gate and up in registers
and writes only the product (GemmEpilogue.glu, emit/templates/glu_epilogue.h):
the up projection is never written, and one launch replaces two.

``fuse_gated_linears(gm, regions, arch)`` rewrites ``gm`` after a first partition
(partition/__init__.py runs the partition again on the rewritten graph). A gated
pair is, on the sm90a target (the GLU epilogue exists for its kernels only), either

* ``mul(act(linear(x, Wg[, bg])), linear(x, Wu[, bu]))`` (either operand order): two
  linears, both GEMM regions of the first pass, on one input, with module-constant
  weights of one shape (LLaMA's and Gemma's gate_proj / up_proj); or
* ``up, gate = linear(x, W[, b]).chunk(2, -1); mul(up, act(gate))`` (either operand
  order, either half the gate): one linear region whose output is split in halves
  (diffusers' GEGLU in the Stable Diffusion UNet's feed-forward blocks);

with ``act`` a one-op activation of the epilogue table (checks.ACTIVATION_NAMES),
each intermediate used only there and without metadata checks, 2-D module-constant
(``get_attr``) weights of f16 / bf16 (the sm90a kernels), N (per half) and K
multiples of 8 (16-byte rows for TMA), K at least ``MIN_K`` (0: measured faster at
every K with the staged GLU store, see MIN_K), constant
biases or none.

The rewrite registers the interleaved weight (and bias: zeros for a member without
one) as buffers ``_co_gated_<i>_weight`` / ``_bias`` and replaces the pair with
``linear(x, W) -> unflatten(-1, (N/8, 2, 8)) -> select(-2, 0) / select(-2, 1) -> act
-> mul -> flatten(-2, -1)``: the same values in PyTorch (so a region that ends up
in PyTorch still computes the model), and the form the GEMM's epilogue growth
matches as a GLU (epilogue.py ``glu_nodes``). The weights are a copy, as with
combined linears (parallel_gemm.py): the members' parameters stay in the user's
module, unused by the offloaded graph. ``CompileOptions.combine_gemms=False``
leaves the linears as they are.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..ir import GemmRegion
from .checks import ACTIVATION_NAMES
from .graph_utils import aten, attr_tensor, fake_like, is_call, metadata_checks, only_user

BLOCK = 8            # rows of one weight per block: a wgmma thread's column group (glu_epilogue.h)
# K from which a gated pair is rewritten: 0, every K. The GLU epilogue stages the
# products in shared memory and stores 16-byte row chunks (emit/glu_sm90.GLU_STAGED).
# Session 37, H100 (benchmarks/results/glu_epilogue_2026-12-05_h100_s37.*), us per
# call against our plain GEMM with bias followed by Inductor's GELU-multiply (what runs
# without the rewrite): the UNet's GEGLU projections 40.4 vs 48.8 (8192 x 2560 x 320),
# 30.0 vs 46.4 (2048 x 5120 x 640), 25.1 vs 36.6 (512 x 10240 x 1280), 14.0 vs 19.1
# (128 x 10240 x 1280); llama's 2048 x 2 x 5632 x 2048 160.9 vs 193.6; sd-unet's
# reduce-overhead forward 6.88 -> 6.73 ms (glue_sdunet_glu_staged_ro_2026-12-05_h100_s37.*).
# Until then it was 2048: the register-stored form (GLU_STAGED False) lost at short K
# (60.1 against 26.4 us for the plain GEMM at 8192 x 2560 x 320, H200, session 23).
MIN_K = 0
PREFIX = "_co_gated_"
DTYPES = (torch.float16, torch.bfloat16)


def interleave(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Rows of ``gate`` and ``up`` ((N, ...) each, N a multiple of BLOCK) interleaved in
    blocks of BLOCK: rows 16i .. 16i+7 of the result are gate's 8i .. 8i+7, rows
    16i+8 .. 16i+15 up's. Returns a new contiguous (2N, ...) tensor."""
    n = gate.shape[0]
    if up.shape != gate.shape or n % BLOCK:
        raise ValueError(f"gate and up must have one shape with N a multiple of {BLOCK}, "
                         f"got {tuple(gate.shape)} and {tuple(up.shape)}")
    rest = gate.shape[1:]
    return torch.stack([gate.reshape(n // BLOCK, BLOCK, *rest), up.reshape(n // BLOCK, BLOCK, *rest)],
                       dim=1).reshape(2 * n, *rest).contiguous()


def _linear(gm, node, linears):
    """(x, weight, bias or None) of a linear region node used once, else None."""
    if node not in linears or len(node.users) != 1 or metadata_checks(node):
        return None
    x, w_node = node.args[0], node.args[1]
    b_node = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    w = attr_tensor(gm, w_node)
    b = attr_tensor(gm, b_node) if b_node is not None else None
    if w is None or w.dim() != 2 or w.dtype not in DTYPES or w.shape[0] % BLOCK or w.shape[1] % BLOCK \
            or w.shape[1] < MIN_K:
        return None
    if b_node is not None and (b is None or b.shape != w.shape[:1] or b.dtype != w.dtype):
        return None
    xv = x.meta.get("val") if isinstance(x, fx.Node) else None
    if getattr(xv, "fake_mode", None) is None or xv.dtype != w.dtype:
        return None
    return x, w, b


def _pair(gm, mul, linears):
    """The rewrite of ``mul`` when it is a gated pair, else None: (act node, x, (gate
    weight, bias or None), (up weight, bias or None), the nodes the rewrite replaces,
    the (gate, up) names its note gives)."""
    if not is_call(mul, aten.mul.Tensor) or len(mul.args) != 2 or mul.kwargs:
        return None
    for act, up in (mul.args, mul.args[::-1]):
        if not isinstance(act, fx.Node) or act.target not in ACTIVATION_NAMES or len(act.args) < 1:
            continue
        gate = act.args[0]
        if only_user(act) is not mul or not isinstance(gate, fx.Node) or not isinstance(up, fx.Node):
            continue
        g, u = _linear(gm, gate, linears), _linear(gm, up, linears)
        if g is not None and u is not None and g[0] is u[0] and g[1].shape == u[1].shape \
                and g[1].device == u[1].device:
            return act, g[0], g[1:], u[1:], (mul, act, gate, up), (gate.name, up.name)
        halves = _halves(gm, gate, up, linears)
        if halves is not None:
            return (act, *halves[:3], (mul, act, gate, up, *halves[3]),
                    (f"{halves[3][-1].name}[gate half]", f"{halves[3][-1].name}[up half]"))
    return None


def _halves(gm, gate, up, linears):
    """(x, (gate weight, bias), (up weight, bias), (chunk, linear)) when ``gate`` and
    ``up`` are the two halves of one linear's output split along its last dim
    (``chunk(2, -1)`` and its two getitems), else None."""
    if not (is_call(gate, operator.getitem) and is_call(up, operator.getitem)) \
            or gate.args[0] is not up.args[0] or {gate.args[1], up.args[1]} != {0, 1} \
            or len(gate.users) != 1 or len(up.users) != 1:
        return None
    chunk = gate.args[0]
    if not is_call(chunk, aten.chunk.default) or len(chunk.users) != 2 or chunk.kwargs:
        return None
    lin = chunk.args[0]
    val = lin.meta.get("val") if isinstance(lin, fx.Node) else None
    if val is None or list(chunk.args[1:]) not in ([2, -1], [2, val.dim() - 1]):
        return None
    whole = _linear(gm, lin, linears)
    if whole is None or whole[1].shape[0] % (2 * BLOCK):
        return None
    x, w, b = whole
    n = w.shape[0] // 2
    parts = [(w[:n], b[:n] if b is not None else None), (w[n:], b[n:] if b is not None else None)]
    if gate.args[1] == 0:
        parts.reverse()
    up_part, gate_part = parts
    return x, gate_part, up_part, (chunk, lin)


def fuse_gated_linears(gm: fx.GraphModule, regions, arch: str) -> list:
    """Rewrite each gated pair (module docstring) of ``gm`` into one linear over the
    interleaved weights and its GLU form, in place; ``arch``: the target ("sm90a"
    or another: nothing is rewritten there). Returns [(new linear's name, (gate
    linear's name, up linear's name))], empty when nothing was rewritten (``gm``
    untouched then)."""
    if arch != "sm90a":
        return []
    nodes = {n.name: n for n in gm.graph.nodes}
    linears = {nodes[r.nodes[0]] for r in regions
               if isinstance(r, GemmRegion) and r.form == "linear" and r.nodes[0] in nodes
               and is_call(nodes[r.nodes[0]], aten.linear.default)}
    done = []
    for mul in list(gm.graph.nodes):
        pair = _pair(gm, mul, linears)
        if pair is not None:
            done.append(_rewrite(gm, *pair, len(done)))
    if done:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return done


def _rewrite(gm, act, x, gate, up, replaced, names, index) -> tuple:
    graph = gm.graph
    (wg, bg), (wu, bu) = gate, up
    mul = replaced[0]
    n = wg.shape[0]
    with torch.no_grad():
        w = interleave(wg.detach(), wu.detach())
        has_bias = bg is not None or bu is not None
        b = interleave(bg.detach() if bg is not None else wg.new_zeros(n),
                       bu.detach() if bu is not None else wu.new_zeros(n)) if has_bias else None
    # every new node's FakeTensor first, so a failure leaves the graph as it was; no
    # op on the symbolic input itself (as parallel_gemm.py: no guard on a dynamic batch)
    xv = x.meta["val"]
    with xv.fake_mode:
        y = xv.new_empty((*xv.shape[:-1], 2 * n))
        v = aten.unflatten.int(y, -1, [n // BLOCK, 2, BLOCK])
        g = aten.select.int(v, -2, 0)
        u = aten.select.int(v, -2, 1)
        a = act.target(g, *act.args[1:], **act.kwargs)
        h = aten.mul.Tensor(a, u)
        out = aten.flatten.using_ints(h, -2, -1)
    w_name, b_name = f"{PREFIX}{index}_weight", f"{PREFIX}{index}_bias"
    gm.register_buffer(w_name, w)
    if has_bias:
        gm.register_buffer(b_name, b)
    order = {nd: i for i, nd in enumerate(graph.nodes)}
    first = min(replaced, key=order.__getitem__)

    def node(target, args, value, kwargs=None):
        nd = graph.call_function(target, args, kwargs or {})
        nd.meta["val"] = value
        return nd

    with graph.inserting_before(first):
        w_node = graph.get_attr(w_name)
        w_node.meta["val"] = fake_like(xv, w)
        args = (x, w_node)
        if has_bias:
            b_node = graph.get_attr(b_name)
            b_node.meta["val"] = fake_like(xv, b)
            args += (b_node,)
        lin = node(aten.linear.default, args, y)
        v_node = node(aten.unflatten.int, (lin, -1, [n // BLOCK, 2, BLOCK]), v)
        g_node = node(aten.select.int, (v_node, -2, 0), g)
        u_node = node(aten.select.int, (v_node, -2, 1), u)
        a_node = node(act.target, (g_node, *act.args[1:]), a, dict(act.kwargs))
        h_node = node(aten.mul.Tensor, (a_node, u_node), h)
        out_node = node(aten.flatten.using_ints, (h_node, -2, -1), out)
    mul.replace_all_uses_with(out_node)
    for old in replaced:            # users first: the product, the activation, ... the linears
        graph.erase_node(old)
    return lin.name, names
