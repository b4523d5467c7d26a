"""Mask patterns: recognising a mask that the attention kernel applies by itself.

The fused attention kernel (emit/attention.py) knows three masking patterns, passed
as its ``causal`` argument: "none" (every query attends to every key), "top_left"
(causal with ``tril`` diagonal 0: query i sees keys j <= i) and "bottom_right"
(causal aligned to the last key, ``tril`` diagonal seq_kv - seq_q: query i sees keys
j <= i + seq_kv - seq_q). A mask computed at compile time that equals one of them is
folded into that argument instead of being read as a bias (partition/attention_forms.py),
and the region module checks the folded mask again once per new shape
(runtime/attention_region.py). The Hopper kernel also knows a top-left sliding window
of W keys (query i sees keys i - W < j <= i: transformers' ``sliding_window``, Mistral,
Gemma 2 / 3), folded the same way where that kernel runs the region.

``mask_pattern(m, kind, seq_q, seq_kv)`` takes a concrete tensor ``m`` that broadcasts
to (..., seq_q, seq_kv) (any leading batch / head dims; rank 1 is a row over the keys)
read as ``kind``: "bool_keep" (True = attend, SDPA's boolean ``attn_mask``),
"bool_masked" (True = masked, ``masked_fill``'s mask) or "float" (additive: 0 attends,
-inf or finfo.min masks). It returns (pattern, soft, window), pattern one of the three
above, soft True when a float mask masks with finfo.min (then exact only for rows that
see at least one key), window the W of a top-left sliding window (0: none), or None
when the mask is not the same pattern for every batch and head. This module depends on torch only: partition/ and runtime/ both use it.
"""
from __future__ import annotations

import torch


def mask_pattern(m: torch.Tensor, kind: str, seq_q: int, seq_kv: int):
    """(pattern, soft, window) when mask ``m`` (read as ``kind``: "bool_keep" True =
    attend, "bool_masked" True = masked, "float" additive) masks the same way for every
    batch and head as one of the kernel's patterns: "none" (nothing masked), "top_left"
    or "bottom_right" (causal), or "top_left" with window W >= 1 (query i sees keys
    i - W < j <= i, W < seq_q: a window as wide as the rows is plain causal); else None.
    soft: a float mask masking with finfo.min (exact only for rows that see a key;
    every row of a window sees its diagonal key). Synchronizes on a CUDA tensor."""
    if seq_q < 1 or seq_kv < 1 or m.dim() < 1:
        return None
    soft = False
    if kind == "float":
        if not m.is_floating_point():
            return None
        keep = m == 0
        low = m == torch.finfo(m.dtype).min
        if not bool((keep | torch.isneginf(m) | low).all()):
            return None
        soft = bool(low.any())
    else:
        if m.dtype != torch.bool:
            return None
        keep = m if kind == "bool_keep" else ~m
    if keep.dim() < 2:
        keep = keep.reshape((1,) * (2 - keep.dim()) + tuple(keep.shape))
    try:
        keep = keep.expand(*keep.shape[:-2], seq_q, seq_kv)
    except RuntimeError:
        return None
    flat = keep.reshape(-1, seq_q, seq_kv)
    first = flat[0]
    if flat.shape[0] > 1 and not bool((flat == first).all()):
        return None
    if bool(first.all()):
        return "none", soft, 0
    rows = torch.arange(seq_q, device=m.device)[:, None]
    cols = torch.arange(seq_kv, device=m.device)[None, :]
    causal = cols <= rows
    if torch.equal(first, causal):
        return "top_left", soft, 0
    if torch.equal(first, cols <= rows + (seq_kv - seq_q)):
        return "bottom_right", soft, 0
    # a sliding window: the last row keeps its W keys (W < seq_q, or it were causal)
    window = int(first[-1].sum())
    if 1 <= window < seq_q and torch.equal(first, causal & (cols > rows - window)):
        return "top_left", soft, window
    return None
