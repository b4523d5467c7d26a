"""Hand-written activations become the one ATen op they compute, so they fuse.

Models spell activations out: ``x * torch.sigmoid(x)`` (swish), ``0.5 * x * (1 +
torch.erf(x / math.sqrt(2)))`` (BERT-era GELU), GPT-2's tanh GELU, ``x * F.relu6(x + 3)
/ 6`` (hardswish), ``1 / (1 + torch.exp(-x))``. Each is several elementwise ops on one
tensor, and a GEMM's epilogue takes one activation op, so the product would leave
the region and make a round trip through memory per op (the epilogue stage table of
epilogue.py accepts ``aten.silu`` and the like, one node each).

``fuse_activation_forms(graph)`` finds, for a tensor ``x``, the smallest elementwise
subgraph that consumes every use of ``x`` and ends in one node (each intermediate
used only inside it, every other argument a Python number, at most ``MAX_NODES``
ops of ``POINTWISE``), evaluates it in float64 on ``SAMPLES`` and compares with each
row of ``FORMS``; where one agrees to ``TOLERANCE`` everywhere it replaces the
subgraph by that op. Identifying the function by its values instead of by its
spelling takes every operand order and algebraic variant (``x * 0.5`` or ``x / 2``,
``x / sqrt(2)`` or ``x * 0.7071...``) with one rule. The tolerance, 1e-6 of the
value's size, is far below what tells two forms apart (tanh against erf GELU: up to
4.7e-4 near |x| = 2) and above float64 rounding of a few ops; a constant written
with fewer digits (``x / 1.414``) differs by more and is left as written.
quick_gelu, ``x * sigmoid(1.702 x)``, has no ATen op: epilogue.py matches it where it
follows a GEMM.

The replacement computes in the input's dtype like the op does (fp16 models: one
rounding instead of one per written op, closer to the float32 result).
"""
from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F

from .graph_utils import aten, val

# elementwise ops a written-out activation is made of; every argument but the
# tensors of the subgraph must be a Python number
POINTWISE = frozenset({
    aten.mul.Tensor, aten.mul.Scalar, aten.add.Tensor, aten.add.Scalar,
    aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Scalar, aten.div.Tensor, aten.div.Scalar,
    aten.neg.default, aten.exp.default, aten.sigmoid.default, aten.tanh.default,
    aten.erf.default, aten.pow.Tensor_Scalar, aten.reciprocal.default, aten.relu.default,
    aten.hardtanh.default, aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default,
} | ({aten.relu6.default} if hasattr(aten, "relu6") else set()))
MAX_NODES = 12
TOLERANCE = 1e-6


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


# (name, the op and its keyword arguments that replace the subgraph, float64 reference)
FORMS = (
    ("silu", aten.silu.default, {}, F.silu),
    ("gelu_erf", aten.gelu.default, {}, F.gelu),
    ("gelu_tanh", aten.gelu.default, {"approximate": "tanh"}, _gelu_tanh),
    ("sigmoid", aten.sigmoid.default, {}, torch.sigmoid),
    ("hardswish", aten.hardswish.default, {}, F.hardswish),
    ("hardsigmoid", aten.hardsigmoid.default, {}, F.hardsigmoid),
)


def _samples() -> torch.Tensor:
    dense = torch.linspace(-12.0, 12.0, 481, dtype=torch.float64)
    wide = torch.tensor([1e-4, 1e-2, 0.3, 2.9, 3.1, 20.0, 50.0, 300.0, 6e4], dtype=torch.float64)
    return torch.cat([dense, wide, -wide])


SAMPLES = _samples()


def fuse_activation_forms(graph: fx.Graph) -> list:
    """Replace each written-out activation of ``graph`` (module docstring) by its op,
    in place. Returns [(form name, name of the node that now computes it)]."""
    done = []
    position = {n: i for i, n in enumerate(graph.nodes)}
    for x in list(graph.nodes):
        if getattr(x, "_erased", False) or not _floating(x):
            continue
        found = _activation_of(x, position)
        if found is None:
            continue
        (name, op, kwargs, _), nodes = found
        out = nodes[-1]
        with graph.inserting_before(out):
            new = graph.call_function(op, (x,), dict(kwargs))
        new.meta["val"] = out.meta.get("val")
        for key in ("stack_trace", "nn_module_stack"):
            if key in out.meta:
                new.meta[key] = out.meta[key]
        out.replace_all_uses_with(new)
        for n in reversed(nodes):
            graph.erase_node(n)
        done.append((name, new.name))
        position = {n: i for i, n in enumerate(graph.nodes)}
    return done


def _floating(n) -> bool:
    v = val(n) if isinstance(n, fx.Node) else None
    return isinstance(v, torch.Tensor) and v.dtype.is_floating_point


def _activation_of(x: fx.Node, position: dict):
    """(FORMS row, subgraph nodes in graph order, the output last) of the activation
    that consumes every use of ``x``, or None."""
    users = list(x.users)
    if not users or not all(_pointwise(u) for u in users):
        return None
    # elementwise ops reachable from x, then (in graph order, so operands come first)
    # those whose tensor operands are all x or kept nodes
    reach, frontier = set(), list(users)
    while frontier:
        n = frontier.pop()
        if n in reach:
            continue
        if len(reach) >= 2 * MAX_NODES:
            break
        reach.add(n)
        frontier += [u for u in n.users if _pointwise(u)]
    closure = set()
    order = sorted(reach, key=position.__getitem__)
    for n in order:
        if all(a is x or a in closure for a in n.args if isinstance(a, fx.Node)):
            closure.add(n)
    if len(closure) > MAX_NODES or not set(users) <= closure:
        return None
    order = [n for n in order if n in closure]
    for out in reversed(order):          # the largest subgraph first
        nodes = _ancestors(out, closure)
        if len(nodes) < 2 or not set(users) <= nodes:
            continue
        if any(u not in nodes for n in nodes if n is not out for u in n.users):
            continue                     # an intermediate is used outside
        ordered = [n for n in order if n in nodes]
        row = _identify(x, ordered)
        if row is not None:
            return row, ordered
    return None


def _pointwise(n: fx.Node) -> bool:
    """An op of POINTWISE with at least one tensor operand, its other operands Python
    numbers, a floating result."""
    if n.op != "call_function" or n.target not in POINTWISE or n.kwargs:
        return False
    if not any(isinstance(a, fx.Node) for a in n.args):
        return False
    return (all(isinstance(a, fx.Node) or a is None     # clamp's open bound
                or (isinstance(a, (int, float)) and not isinstance(a, bool)) for a in n.args)
            and _floating(n))


def _ancestors(out: fx.Node, closure: set) -> set:
    seen, stack = set(), [out]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack += [a for a in n.args if isinstance(a, fx.Node) and a in closure]
    return seen


def _identify(x: fx.Node, ordered: list):
    """The FORMS row the subgraph agrees with on SAMPLES, or None."""
    values = {x: SAMPLES}
    try:
        for n in ordered:
            args = [values[a] if isinstance(a, fx.Node) else a for a in n.args]
            values[n] = n.target(*args)
    except Exception:   # noqa: BLE001 - an op that does not take these arguments: no form
        return None
    y = values[ordered[-1]]
    if not isinstance(y, torch.Tensor) or y.shape != SAMPLES.shape:
        return None
    for row in FORMS:
        ref = row[3](SAMPLES)
        err = (y - ref).abs() / (1.0 + ref.abs())
        if bool(torch.isfinite(y).all()) and float(err.max()) <= TOLERANCE:
            return row
    return None

