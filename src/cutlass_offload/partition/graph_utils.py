"""Small helpers over FX nodes carrying FakeTensor ``meta['val']``."""
from __future__ import annotations

import torch
import torch.fx as fx

from ..dtypes import FROM_TORCH
from ..errors import UnsupportedRegion

aten = torch.ops.aten
# torch.export's metadata checks: they join the region of the node they check
ASSERT_METADATA = getattr(aten, "_assert_tensor_metadata", None)
ASSERT_METADATA = ASSERT_METADATA.default if ASSERT_METADATA is not None else None


def is_call(n, *targets) -> bool:
    """Whether ``n`` is an FX call of one of ``targets``."""
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def users(n) -> list:
    """Users of n, less the metadata checks torch.export inserts (they join the region)."""
    return [u for u in n.users if u.target is not ASSERT_METADATA]


def only_user(n):
    """The one user of node ``n``, or None when it has none or several."""
    return next(iter(n.users)) if len(n.users) == 1 else None


def metadata_checks(n) -> list:
    """The metadata checks torch.export inserted on n."""
    return [u for u in n.users if u.target is ASSERT_METADATA]


def aten_arg(node, index, name):
    """Argument ``name`` of an ATen call: positional, keyword or the schema default."""
    if len(node.args) > index:
        return node.args[index]
    if name in node.kwargs:
        return node.kwargs[name]
    for a in node.target._schema.arguments:
        if a.name == name:
            return a.default_value if a.has_default_value() else None
    return None

DTYPE_NAMES = FROM_TORCH


def val(node):
    """The FakeTensor (or SymInt/int) recorded for a node, or None."""
    if isinstance(node, fx.Node):
        return node.meta.get("val")
    return node


def tensor_dtype(node, what) -> str:
    """The dtype name ("f16", "bf16", "f32") of a tensor-valued node; ``what``
    names it in the UnsupportedRegion raised otherwise."""
    v = val(node)
    if not isinstance(v, torch.Tensor):
        raise UnsupportedRegion(f"{what} is not a tensor")
    if v.dtype not in DTYPE_NAMES:
        raise UnsupportedRegion(f"{what} has dtype {str(v.dtype).replace('torch.', '')}; the kernels "
                                "take float16, bfloat16 and float32 (as TF32)")
    return DTYPE_NAMES[v.dtype]


def attr_tensor(gm: fx.GraphModule, node):
    """The tensor a ``get_attr`` node of ``gm`` names, else None."""
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        return None
    t = gm
    for part in node.target.split("."):
        t = getattr(t, part, None)
    return t if isinstance(t, torch.Tensor) else None


def fake_value(target, args, kwargs=None):
    """``target(*args, **kwargs)`` on the FakeTensor values of the node arguments, in
    their fake mode (for a new node's ``meta['val']``); None when no argument has
    one. Raises what the op raises."""
    vals = [val(a) if isinstance(a, fx.Node) else a for a in args]
    kw = {k: val(v) if isinstance(v, fx.Node) else v for k, v in (kwargs or {}).items()}
    mode = next((getattr(v, "fake_mode", None) for v in vals if isinstance(v, torch.Tensor)), None)
    if mode is None:
        return None
    with mode:
        return target(*vals, **kw)


def call_with_val(graph: fx.Graph, target, args, kwargs=None) -> fx.Node:
    """A new call node of ``graph`` (at its insertion point) with its ``meta['val']``
    (``fake_value``), for rewrites that keep later stages able to read shapes."""
    node = graph.call_function(target, tuple(args), dict(kwargs or {}))
    v = fake_value(target, args, kwargs)
    if v is not None:
        node.meta["val"] = v
    return node


def fake_like(fake_ref, real):
    """A FakeTensor of ``real``'s shape and dtype on ``fake_ref``'s device, in
    ``fake_ref``'s fake mode (a new node's ``meta['val']``); None without one."""
    mode = getattr(fake_ref, "fake_mode", None)
    if mode is None:
        return None
    with mode:
        return torch.empty(real.shape, dtype=real.dtype, device=fake_ref.device)


def is_tensor_node(node) -> bool:
    return isinstance(node, fx.Node) and isinstance(val(node), torch.Tensor)


def static_int(x):
    """x as a Python int when it is static, else None (a symbolic size)."""
    if isinstance(x, int):
        return x
    try:
        if x.node.is_constant():  # SymInt wrapping a constant
            return int(x)
    except AttributeError:
        pass
    return None


def hint_int(x, default=1) -> int:
    """The example value of a (possibly symbolic) size, for heuristics only."""
    if isinstance(x, int):
        return x
    try:
        h = x.node.hint
        return int(h) if h is not None else default
    except AttributeError:
        return default


def same_dim(a, b) -> bool:
    """True when two sizes are provably the same (equal ints or the same symbol)."""
    sa, sb = static_int(a), static_int(b)
    if sa is not None and sb is not None:
        return sa == sb
    return str(a) == str(b)


def same_shape(sa, sb) -> bool:
    return len(sa) == len(sb) and all(same_dim(x, y) for x, y in zip(sa, sb))


def max_alignment(extent, dtype: str) -> int:
    """Largest of 8/4/2/1 elements (4/2/1 for fp32: 16 bytes at most) dividing extent."""
    e = static_int(extent)
    top = 4 if dtype == "f32" else 8
    if e is None:
        return 1
    a = top
    while a > 1 and e % a:
        a //= 2
    return a


def reachable(src: fx.Node, dst: fx.Node) -> bool:
    """True when dst depends on src (a path src -> ... -> dst exists)."""
    if src is dst:
        return True
    order = {n: i for i, n in enumerate(src.graph.nodes)}
    lo = order[src]
    stack, seen = [dst], set()
    while stack:
        n = stack.pop()
        if n is src:
            return True
        if n in seen or order[n] < lo:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return False


def module_paths(gm: fx.GraphModule) -> dict:
    """{node name: "path.of.module (Type)"} of the innermost module each op of ``gm``
    came from (torch.export's ``nn_module_stack``), for the report to say where a
    fallback is in the user's model; nodes without that metadata are left out."""
    out = {}
    for n in gm.graph.nodes:
        stack = n.meta.get("nn_module_stack")
        if not stack:
            continue
        path, kind = list(stack.values())[-1]
        if path:
            out[n.name] = f"{path} ({str(kind).rsplit('.', 1)[-1]})"
    return out


# graph_module.meta key set by capture.py: it traced a batch-2 copy of batch-1 example inputs
BATCH_DOUBLED = "cutlass_offload_batch_doubled"


def input_summary(gm: fx.GraphModule) -> dict:
    """The graph's tensor inputs as the report shows them: {"inputs": [{"name", "shape"
    (sizes: ints, or the symbol of a dynamic size as text), "dtype"}], "dynamic":
    {symbol: [low, high]}} (high None when unbounded), from the placeholders'
    FakeTensors and their shape environment's ranges; "traced_batch": 2 when the
    capture traced a batch-2 copy of batch-1 example inputs (capture.py)."""
    inputs, dynamic = [], {}
    for n in gm.graph.nodes:
        v = n.meta.get("val") if n.op == "placeholder" else None
        if not isinstance(v, torch.Tensor):
            continue
        inputs.append({"name": n.name, "shape": [static_int(d) if static_int(d) is not None else str(d)
                                                 for d in v.shape],
                       "dtype": str(v.dtype).replace("torch.", "")})
        for d in v.shape:
            if static_int(d) is None and str(d) not in dynamic:
                dynamic[str(d)] = _range(d)
    out = {"inputs": inputs, "dynamic": dynamic}
    if getattr(gm, "meta", {}).get(BATCH_DOUBLED):
        out["traced_batch"] = 2
    return out


def _range(size) -> list:
    """[low, high] of a dynamic size (high None when unbounded; [None, None] unknown)."""
    import sympy
    try:
        node = size.node
        r = node.shape_env.var_to_range[node.expr]
        lo = int(r.lower)
    except (AttributeError, KeyError, TypeError, ValueError):
        return [None, None]
    # torch's int_oo calls itself finite (and an integer): only a sympy Integer is a bound
    hi = int(r.upper) if isinstance(r.upper, (int, sympy.Integer)) else None
    return [lo, hi if hi is not None and hi < 2 ** 62 else None]
