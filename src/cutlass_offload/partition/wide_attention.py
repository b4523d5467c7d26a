"""Attention whose head dim exceeds 256 runs as two GEMMs and a softmax.

Why. No flash-style kernel holds an output row of more than 256 values on chip:
the Hopper FMHA's head tiles stop at 256 (families/attention_sm90.py), PyTorch's
flash backend too, and the sm80 memory-efficient kernel (ours, and PyTorch's
"efficient" backend: the same xFormers design) accumulates O in global memory once
the head dim exceeds its 128 keys per block (``kSingleValueIteration`` false:
fmha "gmem" kernels), re-reading and re-writing it for every key block. The SD VAE
decoder's 4096-token attention at head dim 512 took 341 us on our sm80 kernel and
327 us on PyTorch's efficient backend (H100, session 42), while its two GEMMs
(17.2 GFLOP each) take a few tens of microseconds each on Hopper's tensor cores
and the 32 MB of scores one read and one write.

What. ``decompose_wide_sdpa`` rewrites such a ``scaled_dot_product_attention``
(no mask, no dropout, not causal, one K/V head per query head; static head
dims and sequence lengths, the batch and head count may be symbolic) into
the hand-written form

    s = matmul(q * scale, k.transpose(-2, -1))     # a batched GEMM region
    p = softmax(s, -1)                             # glue (fp32 inside, as PyTorch's)
    o = matmul(p, v)                               # a batched GEMM region

and the attention matcher leaves a hand-written attention of such head dims to the
GEMM anchors (``wide_note``), so both forms become two GEMM regions with the
softmax in the glue (Inductor fuses it into one kernel). The scores are
materialized in the input dtype (fp16 / bf16, rounded once after the GEMM's fp32
accumulation, like diffusers' classic attention with ``upcast_softmax``); the
softmax accumulates in fp32. Only where the scores fit in ``MAX_SCORES_BYTES``:
past that the fused kernel's memory use wins. The scale multiplies q (L x E
values) rather than s (L x L). ``CompileOptions.decompose_wide_attention`` False
keeps the fused kernel.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from .graph_utils import aten, aten_arg, hint_int, same_dim, static_int, val
from .graph_utils import call_with_val as _call

MAX_FUSED_HEAD_DIM = 256          # the widest head tile of a flash-style kernel (see above)
MAX_SCORES_BYTES = 1 << 30        # the scores tensor's size (B * H * Lq * Lkv elements)
NOTE_KEY = "co_wide_attention"    # node.meta key: the note a GEMM region of such an attention carries
_DTYPES = (torch.float16, torch.bfloat16)


def wide_note(q: torch.Tensor, v: torch.Tensor, scores_shape) -> str | None:
    """The report's note for an attention with these q and v (FakeTensors) and
    scores of ``scores_shape`` (batch dims..., Lq, Lkv) when it should run as two
    GEMMs and a softmax, else None (the fused kernel). Head dims and sequence lengths
    must be static; a symbolic batch or head count counts at its example value."""
    if not all(isinstance(t, torch.Tensor) for t in (q, v)) or q.dtype not in _DTYPES:
        return None
    e, ev = static_int(q.shape[-1]), static_int(v.shape[-1])
    lengths = [static_int(d) for d in scores_shape[-2:]]
    if e is None or ev is None or any(d is None for d in lengths):
        return None
    if max(e, ev) <= MAX_FUSED_HEAD_DIM:
        return None
    nbytes = math.prod(hint_int(d) for d in scores_shape) * q.element_size()
    if nbytes > MAX_SCORES_BYTES:
        return None
    return (f"attention with head dim {max(e, ev)} runs as two GEMMs and a softmax (the softmax "
            f"in the glue): above head dim {MAX_FUSED_HEAD_DIM} no flash-style kernel keeps a row "
            f"of O on chip; its scores take {_size(nbytes)} (partition/wide_attention.py)")


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"


def decompose_wide_sdpa(gm: fx.GraphModule) -> int:
    """Rewrite, in place, every ``aten.scaled_dot_product_attention`` of ``gm`` that
    ``wide_note`` sends to GEMMs (see the module docstring); returns how many.
    ``meta['val']`` stays valid on every new node; the two matmuls carry the note
    under ``meta[NOTE_KEY]``."""
    graph, count = gm.graph, 0
    for n in list(graph.nodes):
        if not (n.op == "call_function" and n.target is aten.scaled_dot_product_attention.default):
            continue
        q, k, v = n.args[:3]
        qv, kv, vv = val(q), val(k), val(v)
        if not all(isinstance(t, torch.Tensor) for t in (qv, kv, vv)):
            continue
        if (aten_arg(n, 3, "attn_mask") is not None or aten_arg(n, 4, "dropout_p") != 0.0
                or aten_arg(n, 5, "is_causal") is not False or n.kwargs.get("enable_gqa", False)
                or not (qv.dim() == kv.dim() == vv.dim() and qv.dim() in (3, 4))
                or qv.dtype != kv.dtype or qv.dtype != vv.dtype
                or not all(same_dim(a, b) for a, b in zip(qv.shape[:-2], kv.shape[:-2]))
                or static_int(qv.shape[-1]) != static_int(kv.shape[-1])):
            continue
        scale = n.kwargs.get("scale", None)
        e = static_int(qv.shape[-1])
        if scale is None and e is not None:
            scale = 1.0 / math.sqrt(e)
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale):
            continue
        note = wide_note(qv, vv, (*qv.shape[:-1], kv.shape[-2]))
        if note is None:
            continue
        with graph.inserting_before(n):
            qs = _call(graph, aten.mul.Tensor, (q, float(scale)))
            kt = _call(graph, aten.transpose.int, (k, -2, -1))
            s = _call(graph, aten.matmul.default, (qs, kt))
            p = _call(graph, aten.softmax.int, (s, -1))
            o = _call(graph, aten.matmul.default, (p, v))
        s.meta[NOTE_KEY] = o.meta[NOTE_KEY] = note
        n.replace_all_uses_with(o)
        graph.erase_node(n)
        count += 1
    if count:
        gm.recompile()
    return count
