"""Heavy ops the partitioner has no anchor for, reported with a reason.

The pattern table (patterns.py) turns the ops it anchors into regions or into
fallbacks with a reason; every other matmul-, conv-, attention- or norm-like op
would stay in PyTorch silently. This table names them, one row per ATen op:
(the form shown in the report, why it stays, what would offload it when a
rewrite that costs no accuracy exists). ``unanchored_fallbacks`` lists those left
in a graph after partitioning.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..ir import Fallback
from .einsum import REFUSAL_KEY as EINSUM_REFUSAL

aten = torch.ops.aten

_TABLE = {
    # GEMM-like
    "baddbmm.default": ("baddbmm", "no anchor for baddbmm (beta * input + alpha * batch1 @ batch2); "
                        "torch.bmm followed by the add is offloaded"),
    "addbmm.default": ("addbmm", "no anchor for addbmm (a batch-reduced GEMM)"),
    "einsum.default": ("einsum", "a two-operand einsum is lowered to matmul / bmm "
                       "(partition/einsum.py); this one (one or three and more operands, an outer "
                       "product, dynamic sizes outside the batched-matmul form) is not: written as "
                       "torch.matmul / torch.bmm it is offloaded"),
    "_grouped_mm.default": ("grouped_mm", "a grouped GEMM (a mixture of experts' expert matmuls, "
                            "each expert's token count known only at run time): no grouped-GEMM "
                            "kernel is built"),
    "mv.default": ("mv", "matrix-vector product: no GEMV kernel is built"),
    "addmv.default": ("addmv", "matrix-vector product: no GEMV kernel is built"),
    "dot.default": ("dot", "vector dot product: no kernel is built"),
    "tensordot.default": ("tensordot", "no anchor for tensordot; written as torch.matmul it is offloaded"),
    # conv-like
    "conv3d.default": ("conv3d", "3-D convolution: only conv2d (and batched conv1d) are offloaded"),
    "conv3d.padding": ("conv3d", "3-D convolution: only conv2d (and batched conv1d) are offloaded"),
    "conv_transpose1d.default": ("conv_transpose1d", "transposed convolution: no dgrad-style kernel is built"),
    "conv_transpose2d.input": ("conv_transpose2d", "transposed convolution: no dgrad-style kernel is built"),
    "conv_transpose3d.input": ("conv_transpose3d", "transposed convolution: no dgrad-style kernel is built"),
    # attention backends (graphs traced below SDPA's dispatch, e.g. AOTAutograd's)
    "_scaled_dot_product_flash_attention.default": (
        "sdpa_backend", "SDPA's flash backend op (traced below scaled_dot_product_attention): only "
        "the scaled_dot_product_attention op and the written-out softmax form are matched"),
    "_scaled_dot_product_efficient_attention.default": (
        "sdpa_backend", "SDPA's memory-efficient backend op (traced below scaled_dot_product_attention): "
        "only the scaled_dot_product_attention op and the written-out softmax form are matched"),
    "_scaled_dot_product_cudnn_attention.default": (
        "sdpa_backend", "SDPA's cuDNN backend op (traced below scaled_dot_product_attention): only the "
        "scaled_dot_product_attention op and the written-out softmax form are matched"),
    # norms
    "batch_norm.default": ("batch_norm", "batch_norm not folded into a conv (it does not follow a conv "
                           "that only it reads, is in training mode, or its statistics are not "
                           "module constants): no batch norm kernel is built"),
    "_native_batch_norm_legit_no_training.default": (
        "batch_norm", "batch_norm (AOTAutograd's form) is folded only as aten.batch_norm after a conv"),
    "instance_norm.default": ("instance_norm", "no instance norm kernel is built"),
}


def _targets() -> dict:
    out = {}
    for name, row in _TABLE.items():
        packet, _, overload = name.partition(".")
        target = getattr(getattr(aten, packet, None), overload, None)
        if target is not None:          # an op this torch does not have is left out
            out[target] = row
    return out


UNANCHORED = _targets()


# a custom op (not ATen's) whose name says it multiplies matrices, convolves or attends:
# opaque to the partition (its computation is its own), so it is named among the
# fallbacks rather than left unsaid (transformers' MoE experts export as
# transformers::grouped_mm_fallback in fp16)
HEAVY_CUSTOM_WORDS = ("mm", "matmul", "gemm", "linear", "conv", "attention", "attn")


def heavy_custom_op(target) -> str | None:
    """"namespace::name" of a custom op (an OpOverload outside ATen / prims) whose name
    holds one of HEAVY_CUSTOM_WORDS as a word part, else None."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    space, _, rest = target.name().partition("::")
    if space in ("aten", "prims", "cutlass_offload"):
        return None
    parts = rest.split(".")[0].lower().split("_")
    return f"{space}::{rest.split('.')[0]}" if any(w in parts for w in HEAVY_CUSTOM_WORDS) else None


def unanchored_fallbacks(graph: fx.Graph, taken) -> list:
    """A Fallback for each call in ``graph`` of an op in the table, or of a heavy
    custom op (``heavy_custom_op``), not in ``taken`` (the nodes regions hold), in
    graph order."""
    out = []
    for n in graph.nodes:
        if n.op != "call_function" or n in taken:
            continue
        if n.target in UNANCHORED:
            op, why = UNANCHORED[n.target]
            if n.meta.get(EINSUM_REFUSAL):           # the one cause that applies
                why = f"an einsum not lowered to matmul / bmm (partition/einsum.py): {n.meta[EINSUM_REFUSAL]}"
            elif n.target is aten.batch_norm.default:
                why = _batch_norm_reason(n)
            out.append(Fallback(n.name, op, why))
        elif (name := heavy_custom_op(n.target)) is not None:
            out.append(Fallback(n.name, name, f"a custom op ({name}): opaque to the partition, "
                                "it runs as its library implements it"))
    return out


def _batch_norm_reason(n: fx.Node) -> str:
    """Why an ``aten.batch_norm`` was not folded into a conv (canonicalize.py's
    ``_fold_batch_norm``): the first of its conditions that fails."""
    src = n.args[0]
    training = n.args[5] if len(n.args) > 5 else n.kwargs.get("training", False)
    if training:
        return "batch_norm in training mode (batch statistics): no batch norm kernel is built"
    conv = isinstance(src, fx.Node) and src.op == "call_function" and src.target is aten.conv2d.default
    if not conv:                       # the fold takes an aten.conv2d only
        what = getattr(src, "target", src)
        return (f"batch_norm after {getattr(what, '__name__', what)}, not after a conv (a "
                "pre-activation norm, say): only one after a conv folds into it; no batch norm "
                "kernel is built")
    if len(src.users) != 1:
        return ("batch_norm after a conv whose output is read elsewhere too, so its weights "
                "cannot change: no batch norm kernel is built")
    return ("batch_norm after a conv, with statistics or weights that are not module constants: "
            "no batch norm kernel is built")