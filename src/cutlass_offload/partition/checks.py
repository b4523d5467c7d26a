"""Named predicates of the GEMM pattern table.

Operand readers return ``Operands`` or raise ``UnsupportedRegion(reason)``.
Epilogue checks take ``(state, node)`` and return None when the node may join
the region, else a short reason (kept in the region's notes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx as fx

from ..errors import UnsupportedRegion
from .graph_utils import (DTYPE_NAMES, aten, hint_int, reachable, same_dim, same_shape, static_int,
                          tensor_dtype, val)

# What an fp32 GEMM or conv left in PyTorch may do: no advice that costs accuracy unasked
# (an op a model keeps in fp32 on purpose, e.g. RoPE's angles, should stay so)
FP32_ADVICE = ("a model left in fp32 by mistake: cast it and its inputs to fp16 / bf16; "
                "allow_tf32=True / --tf32 runs fp32 ones as TF32, inputs rounded to 10-bit mantissas")
# ... and where the model itself casts an operand to fp32 for this op (GPT-J's attention
# scores from fp16, RoPE's positions from int64), it asks for fp32: no advice to round it
FP32_ON_PURPOSE = ("the model casts an operand from {src} to fp32 for this op on purpose; "
                   "allow_tf32=True / --tf32 would run it as TF32, less precise than it asks")
_LAYOUT = (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.transpose.int,
           aten.permute.default, aten.expand.default, aten.clone.default, aten.contiguous.default,
           aten.unsqueeze.default, aten.squeeze.dim, aten.t.default)


def upcast_from(node) -> Optional[str]:
    """The dtype (e.g. "float16", "int64") an fp32 operand was cast from, read back
    through layout ops (views, transposes, copies), or None."""
    for _ in range(8):
        if not isinstance(node, fx.Node) or node.op != "call_function":
            return None
        if node.target in (aten._to_copy.default, aten.to.dtype) and node.args:
            src = val(node.args[0])
            if not isinstance(src, torch.Tensor) or src.dtype == torch.float32:
                return None
            return str(src.dtype).replace("torch.", "")
        if node.target not in _LAYOUT or not node.args:
            return None
        node = node.args[0]
    return None


def fp32_reason(what: str, *operands) -> str:
    """Why an fp32 ``what`` ("GEMM", "conv") stays in PyTorch without TF32, with the
    advice that fits: none that costs accuracy where the model upcast it on purpose."""
    src = next((d for d in map(upcast_from, operands) if d), None)
    advice = FP32_ON_PURPOSE.format(src=src) if src else FP32_ADVICE
    return f"fp32 {what}: TF32 not allowed, so it stays in PyTorch in fp32 ({advice})"


@dataclass
class Operands:
    """What an anchor computes, read off the graph."""

    form: str
    a: fx.Node
    b: fx.Node
    b_nk: bool                 # b is stored (N, K): logical B = b^T
    m_dims: tuple              # sizes folded into M (leading dims of A + M)
    n: int
    k: int
    dtype: str
    batch_mode: str = "fold"
    batch_dims: tuple = ()     # sizes of L when batched
    bias: Optional[fx.Node] = None
    c: Optional[fx.Node] = None  # addmm input of full output shape: residual add
    layout_a: str = "row"        # "col": M contiguous (a transposed view)


@dataclass
class EpilogueState:
    anchor: fx.Node
    operands: Operands
    out: fx.Node               # current region output
    bias: bool = False
    activation: str = "identity"
    residual: str = "none"
    post_activation: str = "identity"
    residual_broadcast: bool = False
    residual_per_sample: bool = False
    glu: bool = False
    c: Optional[fx.Node] = None
    nodes: list = field(default_factory=list)


# ---------------------------------------------------------------- operand readers

def _common_dtype(a, b, options) -> str:
    da, db = tensor_dtype(a, "A"), tensor_dtype(b, "B")
    if da != db:
        raise UnsupportedRegion(f"mixed input dtypes {da} x {db} (PyTorch's own matmul refuses "
                                "them: cast the model or its inputs to one dtype)")
    if da == "f32" and not options.allow_tf32:
        raise UnsupportedRegion(fp32_reason("GEMM", a, b))
    return da


def _static(x, what) -> int:
    s = static_int(x)
    if s is None:
        raise UnsupportedRegion(f"dynamic {what}")
    return s


def _a_layout(a) -> str:
    """"row" when A's K is contiguous (or K is 1), "col" when its M is (a transposed
    view); UnsupportedRegion when neither is."""
    v = val(a)
    if v.dim() < 2 or static_int(v.shape[-1]) == 1 or static_int(v.stride(-1)) == 1:
        return "row"
    if static_int(v.stride(-2)) == 1:
        return "col"
    raise UnsupportedRegion("A has neither K nor M contiguous (copy it with .contiguous())")


def _b_layout_ok(b):
    """B must have a unit stride along K (col) or N (row) in its last two dims."""
    v = val(b)
    if static_int(v.stride(-1)) == 1 or static_int(v.stride(-2)) == 1:
        return
    raise UnsupportedRegion("B has no unit stride in its last two dims")


def linear_operands(node, options) -> Operands:
    x, w = node.args[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    dtype = _common_dtype(x, w, options)
    xv, wv = val(x), val(w)
    if wv.dim() != 2 or xv.dim() < 1:
        raise UnsupportedRegion("linear needs a 2-D weight")
    k = _static(xv.shape[-1], "K")
    n = _static(wv.shape[0], "N")
    layout_a = _a_layout(x)
    _b_layout_ok(w)
    if bias is not None:
        if tensor_dtype(bias, "bias") != dtype or val(bias).dim() != 1:
            raise UnsupportedRegion("linear bias must be a 1-D vector of the input dtype")
    if layout_a == "col":
        if dtype == "f32":
            raise UnsupportedRegion("an fp32 (TF32) Linear needs its input K-contiguous "
                                    "(wgmma reads 32-bit operands K-major only)")
        # (..., M, K) with M contiguous: each leading index is one column-major
        # (M, K) matrix, all sharing the weight (their rows cannot fold into M)
        lead = tuple(xv.shape[:-2])
        return Operands("linear", x, w, True, (xv.shape[-2],), n, k, dtype, bias=bias,
                        batch_mode="b_broadcast" if lead else "fold", batch_dims=lead,
                        layout_a="col")
    return Operands("linear", x, w, True, tuple(xv.shape[:-1]), n, k, dtype, bias=bias)


def _batched(form, a, b, options) -> Operands:
    dtype = _common_dtype(a, b, options)
    av, bv = val(a), val(b)
    if av.dim() < 2 or bv.dim() < 2:
        raise UnsupportedRegion("matrix-vector product (1-D operand)")
    k = _static(av.shape[-1], "K")
    if not same_dim(bv.shape[-2], av.shape[-1]):
        raise UnsupportedRegion("K of A and B differ")
    n = _static(bv.shape[-1], "N")
    layout_a = _a_layout(a)
    _b_layout_ok(b)
    ab = _strip_ones(av.shape[:-2])
    bb = _strip_ones(bv.shape[:-2])
    if layout_a == "col":
        if dtype == "f32":
            raise UnsupportedRegion("an fp32 (TF32) GEMM needs A K-contiguous (wgmma reads "
                                    "32-bit operands K-major only): copy it with .contiguous()")
        if not bb:    # B shared: one column-major (M, K) matrix per leading index of A
            lead = tuple(av.shape[:-2])
            return Operands(form, a, b, False, (av.shape[-2],), n, k, dtype,
                            batch_mode="b_broadcast" if lead else "fold", batch_dims=lead,
                            layout_a="col")
    if not bb:        # B shared by every batch entry: fold A's batch into M
        return Operands(form, a, b, False, tuple(av.shape[:-1]), n, k, dtype)
    if not ab:
        return Operands(form, a, b, False, (av.shape[-2],), n, k, dtype,
                        batch_mode="a_broadcast", batch_dims=tuple(bv.shape[:-2]), layout_a=layout_a)
    if same_shape(ab, bb):      # equal batch dims once leading 1s are dropped
        return Operands(form, a, b, False, (av.shape[-2],), n, k, dtype,
                        batch_mode="batched", batch_dims=tuple(av.shape[:-2]), layout_a=layout_a)
    batch = _broadcast_dims(ab, bb)
    if batch is None:
        raise UnsupportedRegion(
            f"batch dims {tuple(av.shape[:-2])} x {tuple(bv.shape[:-2])} do not broadcast provably")
    # a partial broadcast ((3, 1) x (3, 2)): the repeated operand is expanded (a copy
    # of it per call), since one batch stride cannot walk it
    return Operands(form, a, b, False, (av.shape[-2],), n, k, dtype,
                    batch_mode="expand", batch_dims=batch, layout_a=layout_a)


def _broadcast_dims(da, db):
    """The broadcast of two batch shapes, right-aligned, when every pair of dims is
    provably equal or one of them is a static 1; else None."""
    out = []
    for i in range(1, max(len(da), len(db)) + 1):
        x = da[-i] if i <= len(da) else 1
        y = db[-i] if i <= len(db) else 1
        if static_int(x) == 1:
            out.append(y)
        elif static_int(y) == 1 or same_dim(x, y):
            out.append(x)
        else:
            return None
    return tuple(reversed(out))


def _strip_ones(dims):
    dims = list(dims)
    while dims and static_int(dims[0]) == 1:
        dims.pop(0)
    return tuple(dims)


def matmul_operands(node, options) -> Operands:
    return _batched("matmul", node.args[0], node.args[1], options)


def mm_operands(node, options) -> Operands:
    return _batched("mm", node.args[0], node.args[1], options)


def bmm_operands(node, options) -> Operands:
    return _batched("bmm", node.args[0], node.args[1], options)


def addmm_operands(node, options) -> Operands:
    inp, a, b = node.args[0], node.args[1], node.args[2]
    beta = node.kwargs.get("beta", 1)
    alpha = node.kwargs.get("alpha", 1)
    if beta != 1 or alpha != 1:
        raise UnsupportedRegion("addmm with alpha/beta != 1")
    ops = _batched("addmm", a, b, options)
    iv = val(inp)
    if tensor_dtype(inp, "addmm input") != ops.dtype:
        raise UnsupportedRegion("addmm input dtype differs")
    out_shape = val(node).shape
    if iv.dim() >= 1 and same_dim(iv.shape[-1], ops.n) and all(static_int(d) == 1 for d in iv.shape[:-1]):
        ops.bias = inp
    elif same_shape(iv.shape, out_shape):
        ops.c = inp
    else:
        raise UnsupportedRegion(f"addmm input of shape {tuple(iv.shape)} broadcasts partially")
    return ops


# ---------------------------------------------------------------- epilogue checks

def all_of(*preds):
    """Combine checks: the first reason to refuse wins."""
    def check(state, node):
        for p in preds:
            r = p(state, node)
            if r:
                return r
        return None
    check.__name__ = "all_of(" + ", ".join(p.__name__ for p in preds) + ")"
    return check


def _other(state, node):
    if len(node.args) != 2:
        return None
    a, b = node.args
    return b if a is state.out else a


def no_bias_yet(state, node):
    return "a second bias" if state.bias else None


def no_activation_yet(state, node):
    return "a second activation" if state.activation != "identity" else None


def no_residual_yet(state, node):
    return "a second residual" if state.residual != "none" else None


def bias_before_activation(state, node):
    return ("a bias after the activation (the epilogue adds its bias first)"
            if state.activation != "identity" else None)


def before_residual(what: str):
    """A check: ``what`` (a bias, an activation) may not follow the residual."""
    def check(state, node):
        return (f"{what} after the residual (the epilogue's order: bias, activation, residual, "
                "then a relu)" if state.residual != "none" else None)
    check.__name__ = f"{what.split()[-1]}_before_residual"
    return check


def kernel_takes_residual(state, node):
    """A grouped conv's kernel (CUTLASS 2.x grouped fprop) has no residual epilogue:
    the add stays in the glue."""
    if getattr(state.operands, "grouped", False):
        return "a grouped conv's kernel has no residual epilogue"
    return None


def has_residual(state, node):
    return None if state.residual != "none" else "relu after a residual only"


def no_post_activation_yet(state, node):
    return "a second post-activation" if state.post_activation != "identity" else None


def alpha_is_one(state, node):
    return None if node.kwargs.get("alpha", 1) == 1 else "add with alpha != 1"


def is_channel_vector(state, o) -> bool:
    """A conv's per-output-channel tensor: (K, 1, 1) or (1, K, 1, 1) against NCHW."""
    ov = val(o)
    if state.operands.form != "conv2d" or not isinstance(ov, torch.Tensor) or ov.dim() < 3:
        return False
    shape = [static_int(d) for d in ov.shape]
    return (shape[-3] == state.operands.n and shape[-2:] == [1, 1]
            and all(d == 1 for d in shape[:-3]) and ov.dim() <= 4)


def other_is_column_vector(state, node):
    o = _other(state, node)
    if not isinstance(o, fx.Node) or not isinstance(val(o), torch.Tensor):
        return "bias is not a tensor"
    ov = val(o)
    if state.operands.form == "conv2d":
        return None if is_channel_vector(state, o) else "not a per-channel (K, 1, 1) tensor"
    if ov.dim() < 1 or not same_dim(ov.shape[-1], state.operands.n):
        return "not a per-column vector"
    if any(static_int(d) != 1 for d in ov.shape[:-1]):
        return "not a per-column vector"
    return None


def is_sample_channel_tensor(state, o) -> bool:
    """A conv's per-sample, per-output-channel tensor: (N, K, 1, 1) against the
    (N, K, P, Q) output (the UNet's time embedding, a squeeze-excite scale)."""
    ov, out = val(o), val(state.out)
    if state.operands.form != "conv2d" or not isinstance(ov, torch.Tensor) or ov.dim() != 4:
        return False
    return (same_dim(ov.shape[0], out.shape[0]) and static_int(ov.shape[1]) == state.operands.n
            and [static_int(d) for d in ov.shape[2:]] == [1, 1])


def other_is_full_shape(state, node):
    """The residual has the output's shape; for a conv, a per-channel (K, 1, 1)
    tensor is also accepted (the kernel broadcasts it: residual_broadcast), and a
    per-sample (N, K, 1, 1) one where the conv's operands allow it
    (``ConvOperands.per_sample_refusal`` is None: residual_per_sample)."""
    o = _other(state, node)
    if isinstance(o, (int, float)) and len(node.args) == 2:
        return ("a scalar factor: the epilogue has no output scale" if "mul" in str(node.target)
                else "a constant added: no epilogue stage adds one")
    if not isinstance(o, fx.Node) or not isinstance(val(o), torch.Tensor):
        return "residual is not a tensor"
    if same_shape(val(o).shape, val(state.out).shape) or is_channel_vector(state, o):
        return None
    shape = tuple(val(o).shape)
    if is_sample_channel_tensor(state, o):
        why = getattr(state.operands, "per_sample_refusal", "not a conv")
        return None if why is None else f"per-sample per-channel tensor {shape}: {why}"
    out = tuple(val(state.out).shape)
    size = lambda dims: math.prod(hint_int(d) for d in dims)  # noqa: E731
    if len(shape) >= len(out) and size(shape) > size(out):
        # the region's output is the one that broadcasts (a squeeze-excite gate x * s(.)):
        # the product is larger than the GEMM's output, so it cannot be its epilogue
        # no shapes in the text: one report line for every such gate of a model
        return ("the region's output broadcasts against a larger tensor (a gate, as in "
                "squeeze-excite): the product is larger than the region's output, so not its epilogue")
    return f"a tensor of shape {shape} that broadcasts to the output {out} (only a full one or a per-channel vector fuses)"


def other_same_dtype(state, node):
    o = _other(state, node)
    ov = val(o) if isinstance(o, fx.Node) else None
    if ov is None or DTYPE_NAMES.get(ov.dtype) != state.operands.dtype:
        return "operand dtype differs from the GEMM's"
    return None


def other_independent_of_gemm(state, node):
    o = _other(state, node)
    if reachable(state.anchor, o):
        return "residual depends on the GEMM's own output"
    return None


def _gelu_approximate(node) -> str:
    """gelu's ``approximate`` argument, given by keyword or by position."""
    if len(node.args) > 1:
        return node.args[1]
    return node.kwargs.get("approximate", "none")


ACTIVATION_NAMES = {
    aten.relu.default: lambda n: "relu",
    aten.silu.default: lambda n: "silu",
    aten.sigmoid.default: lambda n: "sigmoid",
    aten.hardswish.default: lambda n: "hardswish",
    aten.hardsigmoid.default: lambda n: "hardsigmoid",
    aten.gelu.default: lambda n: "gelu_tanh" if _gelu_approximate(n) == "tanh" else "gelu_erf",
}


def m_hint(dims) -> int:
    return int(math.prod(hint_int(d) for d in dims)) if dims else 1
