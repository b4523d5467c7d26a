"""The readers of the attention forms (see partition/attention.py for what is
matched and why a form stays in PyTorch): ``sdpa_operands`` for
``aten.scaled_dot_product_attention``, ``softmax_operands`` / ``_read_softmax_form``
for the hand-written ``softmax(q @ k^T * scale [+ bias]) @ v``. Each returns the
AttentionOperands that partition/attention.make_attention_region turns into a region.

Also here: the fold of a mask computed in the graph (its value from
partition/constants.constant_value) into the kernel's causal argument (``_fold_mask``,
through masks.mask_pattern), and the layout of the region's output (``_absorb_output``).
"""
from __future__ import annotations

import math
import weakref
from typing import Optional

import torch
import torch.fx as fx

from ..errors import UnsupportedRegion
from ..ir import note_mask_folded
from ..target import ALIASES
from ..layout_copies import is_layout_copy
from ..masks import mask_pattern
from .attention import (_MATMULS, AttentionOperands, _arg, _call, _cast_of, _checks,
                        _is_heads_transpose, _is_last_two_transpose, _logits_source, _number,
                        _scaled, _tensor, _users)
from . import bias_sum
from .constants import constant_value
from .graph_utils import aten, hint_int, same_shape, static_int, val
from .wide_attention import NOTE_KEY as WIDE_NOTE_KEY, wide_note

_SAME_SHAPE_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
# Hand-written attention with a tanh soft-cap on its logits (Gemma 2) as one region on
# the Hopper kernel's SoftcapFusion (emit/attention_sm90.py); False leaves it two GEMMs
# and the softmax, with the reason (a switch for A/B runs and for a kernel fault found
# later). On since tests/gpu/test_softcap_attention_gpu.py's forms passed on an H100
# (session 56, fp16 / bf16, causal or not, against float32).
SOFTCAP: bool = True
# A compile-time sliding-window mask folded into the Hopper kernel's WindowFusion
# (``window_ok``); False keeps such masks the sm80 kernel's bias, as before the fold
# existed (a switch for A/B runs: benchmarks/window_attention.py).
SLIDING_WINDOW: bool = True


# -------------------------------------------------------------- compile-time masks

# graph -> {(mask node, kind, seq_q, seq_kv): mask_pattern's answer}: one mask serves
# every layer (llama's 16 SDPAs read one causal mask; checking it took 1.07 of the
# 1.08 s of its partition on 2 cores, session 50)
_PATTERNS = weakref.WeakKeyDictionary()


def window_ok(options, q: fx.Node, v: fx.Node) -> bool:
    """Whether a sliding-window mask may fold into the kernel: only the Hopper kernel
    applies one, so only for an sm_90a target (partition's default) and a problem of its
    dtypes, head dims and static sequence lengths (families/attention_sm90.refusal);
    elsewhere the mask stays a bias, which the sm80 kernel reads."""
    if not SLIDING_WINDOW or (ALIASES[options.arch] if options.arch else "sm90a") != "sm90a":
        return False
    qv, vv = val(q), val(v)
    if not (isinstance(qv, torch.Tensor) and isinstance(vv, torch.Tensor)):
        return False
    e, ev = static_int(qv.shape[-1]), static_int(vv.shape[-1])
    # static sequence lengths: the Hopper kernel takes no dynamic ones
    static = static_int(qv.shape[-2]) is not None and static_int(vv.shape[-2]) is not None
    return (qv.dtype in (torch.float16, torch.bfloat16) and e is not None and e == ev
            and e % 8 == 0 and e <= 256 and static)


def _fold_mask(mask: fx.Node, kind: str, seq_q, seq_kv, window_ok: bool = False):
    """(causal, symbolic, window) when ``mask`` folds into the kernel's causal argument
    (a sliding window only with ``window_ok``)."""
    got = constant_value(mask)
    if got is None:
        return None
    value, symbolic = got
    lq, lk = hint_int(seq_q, -1), hint_int(seq_kv, -1)
    if lq < 1 or lk < 1:
        return None
    memo = _PATTERNS.setdefault(mask.graph, {})
    key = (mask, kind, lq, lk)
    if key not in memo:
        try:
            memo[key] = mask_pattern(value, kind, lq, lk)
        except RuntimeError:
            memo[key] = None
    found = memo[key]
    if found is None:
        return None
    pattern, soft, window = found
    if window and not window_ok:
        return None
    if soft and pattern == "bottom_right":
        # finfo.min masks rows with no key softly (PyTorch averages them): exact only
        # while every row sees a key, i.e. seq_q <= seq_kv, provably
        sq, sk = static_int(seq_q), static_int(seq_kv)
        if sq is None or sk is None or sq > sk:
            return None
    return pattern, symbolic, window


def _apply_fold(ops: AttentionOperands, folded, mask: fx.Node, kind: str, label: str) -> None:
    """Record a folded mask in ``ops``: the kernel's causal mode and window, the mask
    kept only to be checked (and for the PyTorch fallback), and the report's note."""
    ops.causal, ops.mask_check, ops.window = folded
    ops.mask, ops.mask_kind = mask, kind
    ops.notes.append(note_mask_folded(label, mask.name, folded[0], bool(folded[1]), folded[2]))


# ------------------------------------------------------------------ output layout

def _view_ok(shape, strides, target) -> bool:
    """A ``view`` to ``target`` works on a tensor of this shape and these strides."""
    if any(static_int(x) is None for x in list(shape) + list(target)):
        return False
    try:
        torch.empty_strided(tuple(shape), tuple(strides), device="meta").view(tuple(target))
        return True
    except RuntimeError:
        return False


def _absorb_output(out: fx.Node, rank: int):
    """(region output, extra nodes, out_layout): a transpose of the (B, H, L, Ev)
    output to (B, L, H, Ev) (after reshapes to its own shape, before a
    ``contiguous``) joins the region, which then returns the BMHK tensor."""
    if rank != 4:
        return out, [], "strided"
    x, extra = out, []
    while True:
        users = _users(x)
        if len(users) != 1:
            break
        u = users[0]
        if _call(u, *_SAME_SHAPE_VIEWS) and same_shape(val(u).shape, val(x).shape):
            extra.append(u)
            x = u
            continue
        if _is_heads_transpose(u):
            extra.append(u)
            users = _users(u)
            if len(users) == 1 and (_call(users[0], aten.contiguous.default) or (
                    _call(users[0], aten.clone.default)
                    and users[0].kwargs.get("memory_format") in (None, torch.contiguous_format))):
                extra.append(users[0])
                return users[0], extra, "bmhk"
            return u, extra, "bmhk"
        break
    # not transposed back: (B, H, L, Ev) strided over a BMHK buffer; a view that
    # needs other strides gets a contiguous copy
    v = val(out)
    shape = tuple(v.shape)
    strides = None
    if all(static_int(d) is not None for d in shape):
        b, h, l, e = shape
        strides = (l * h * e, e, h * e, 1)
    for u in out.users:
        if _call(u, aten.view.default, aten._unsafe_view.default):
            if strides is None or not _view_ok(shape, strides, u.args[1]):
                return out, [], "contiguous"
    return out, [], "strided"


# --------------------------------------------------------------------------- SDPA

def sdpa_operands(node, options) -> AttentionOperands:
    """aten.scaled_dot_product_attention.default."""
    q, k, v = node.args[:3]
    mask = _arg(node, 3, "attn_mask")
    dropout = _arg(node, 4, "dropout_p")
    is_causal = _arg(node, 5, "is_causal")
    scale = node.kwargs.get("scale", None)
    enable_gqa = node.kwargs.get("enable_gqa", False)
    if _number(dropout) is None or _number(dropout) != 0.0:
        raise UnsupportedRegion(f"dropout_p={dropout} (attention dropout runs in PyTorch)")
    if not isinstance(is_causal, bool):
        raise UnsupportedRegion(f"is_causal={is_causal!r} is not a constant")
    qv = _tensor(q, "q")
    e = static_int(qv.shape[-1])
    if scale is None:
        if e is None:
            raise UnsupportedRegion("dynamic head dim")
        scale = 1.0 / math.sqrt(e)
    elif _number(scale) is None:
        raise UnsupportedRegion(f"scale {scale!r} is not a constant number")
    copies = []
    q, k, v = (_through_layout_copy(x, node, copies) for x in (q, k, v))
    ops = AttentionOperands("sdpa", q, k, v, [node, *copies], node, float(scale),
                            causal="top_left" if is_causal else "none")
    if copies:
        ops.notes.append(f"reads q / k / v in place: {len(copies)} layout cop"
                         f"{'y' if len(copies) == 1 else 'ies'} before SDPA joined the region")
    if mask is not None:
        mv = _tensor(mask, "attn_mask")
        kind = "bool_keep" if mv.dtype == torch.bool else "float"
        if is_causal:
            raise UnsupportedRegion("attn_mask together with is_causal=True")
        lk = _tensor(k, "k").shape[-2]
        folded = _fold_mask(mask, kind, qv.shape[-2], lk, window_ok(options, q, v))
        if folded is not None:
            _apply_fold(ops, folded, mask, kind, "attn_mask")
        else:
            ops.bias, ops.bias_kind = mask, kind
    ops.output, extra, ops.out_layout = _absorb_output(node, qv.dim())
    ops.nodes += extra
    ops.enable_gqa = enable_gqa is True
    return ops


def _through_layout_copy(x, sdpa, copies: list):
    """The input of ``x`` when ``x`` is a layout-only copy (layout_copies.py: Hugging
    Face's ``.transpose(1, 2).contiguous()`` head split) that only ``sdpa`` uses: the
    region reads the strided view in place (runtime/attention_region.py takes any
    batch / seq / head strides) and the copy joins the region, for its PyTorch
    fallback. Else ``x``."""
    if not is_layout_copy(x) or _users(x) != [sdpa]:
        return x
    if x not in copies:                # one copy may be both k and v
        copies.append(x)
    return x.args[0]


# ---------------------------------------------------------------- hand-written form

def _single_user(n) -> Optional[fx.Node]:
    users = _users(n)
    return users[0] if len(users) == 1 and len(n.users) == len(users) + len(_checks(n)) else None


def softmax_operands(node, options) -> Optional[AttentionOperands]:
    """The hand-written attention around a softmax over the last axis; None when this
    softmax is not between a q @ k^T and a p @ v matmul."""
    x = node.args[0]
    xv = val(x)
    if not isinstance(xv, torch.Tensor) or xv.dim() not in (3, 4):
        return None
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if not isinstance(dim, int) or dim % xv.dim() != xv.dim() - 1:
        return None
    # -- probabilities, walked forward from the softmax to the p @ v matmul
    tail, p = [], node
    nxt = _single_user(p)
    while nxt is not None and len(tail) < 3 and not _call(nxt, *_MATMULS):
        tail.append(nxt)
        p, nxt = nxt, _single_user(nxt)
    if nxt is None or not _call(nxt, *_MATMULS) or nxt.args[0] is not p:
        return None
    pv = nxt
    # -- logits, walked back from the softmax to the q @ k^T matmul
    chain, cur = [], x
    while isinstance(cur, fx.Node) and not _call(cur, *_MATMULS) and len(chain) < 12:
        chain.append(cur)
        cur = _logits_source(cur)
    if not _call(cur, *_MATMULS):
        blocker = _unwalked_op(chain)
        if blocker is not None:     # attention all the same: say what hid it
            raise UnsupportedRegion(
                f"hand-written attention: {blocker.target} between q @ k^T and the "
                "softmax, which the attention kernels do not compute (the two matmuls run as GEMM "
                "regions, the softmax in PyTorch)")
        return None
    mm = cur
    # from here on it is attention: refusals become fallbacks with a reason
    ops = _read_softmax_form(node, mm, list(reversed(chain)), tail, pv, options)
    note = (wide_note(val(ops.q), val(ops.v), val(mm).shape)
            if options.decompose_wide_attention and isinstance(val(mm), torch.Tensor) else None)
    if note is not None:         # its matmuls become GEMM regions (partition/wide_attention.py)
        mm.meta[WIDE_NOTE_KEY] = pv.meta[WIDE_NOTE_KEY] = note
        return None
    return ops


def _unwalked_op(chain):
    """The op that hid the q @ k^T matmul from the logits walk when one lies within a
    few ops behind where it stopped (the last node of ``chain``), else None (then the
    softmax is not attention's): of the ops on the path from there to the matmul, the
    one nearest the matmul that the walk does not pass (an add of a bias is passed when
    its other side is walkable; Swin-V2's per-head ``* s`` below it is what hides it)."""
    if not chain:
        return None
    stop = chain[-1]
    paths = [[stop]]
    for _ in range(4):
        paths = [p + [a] for p in paths for a in p[-1].args
                 if isinstance(a, fx.Node) and a.op == "call_function"]
        hit = next((p for p in paths if _call(p[-1], *_MATMULS)), None)
        if hit is not None:
            unwalked = [n for n, nxt in zip(hit, hit[1:]) if _logits_source(n) is not nxt]
            return unwalked[-1] if unwalked else stop
    return None


def _one_bias(ops: AttentionOperands, biases: list, fill, lq, lk):
    """The one bias left for the kernel of the additive ``biases`` on the logits (none,
    one, or two: BLOOM adds its ALiBi bias, then the causal mask): of two, the one
    that is a compile-time causal pattern is folded into ``ops`` (the kernel's causal
    mask) and the other returned. UnsupportedRegion when two stay."""
    what = "hand-written attention"
    if len(biases) < 2:
        return biases[0] if biases else None
    if fill is not None:
        raise UnsupportedRegion(f"{what}: two biases and a masked_fill on the logits (the "
                                "kernel takes one bias and a causal mask)")
    for i, b in enumerate(biases):
        folded = _fold_mask(b, "float", lq, lk) if isinstance(b, fx.Node) else None
        if folded is not None:
            _apply_fold(ops, folded, b, "float", "mask")
            return biases[1 - i]
    raise UnsupportedRegion(f"{what}: two biases are added to the logits and neither is a "
                            "compile-time causal mask (the kernel adds one bias: adding the two "
                            "first, logits + (b1 + b2), makes it one region)")


def _through_upcasts(q, mm, k, k_consumer, nodes):
    """(q, k, upcast): GPT-J's ``q.to(float32) @ k.to(float32)^T`` read as the kernel's
    q @ k^T on the 16-bit q and k (their products are exact in fp32 and the kernel sums
    them in fp32, as the fp32 matmul does); the casts join ``nodes``. Unchanged, and
    upcast False, unless both are fp32 casts of one 16-bit dtype used only here."""
    cq = _cast_of(q) if isinstance(q, fx.Node) else None
    ck = _cast_of(k) if isinstance(k, fx.Node) else None
    if cq is None or ck is None or cq[1] != torch.float32 or ck[1] != torch.float32:
        return q, k, False
    sq, sk = val(cq[0]), val(ck[0])
    if not (isinstance(sq, torch.Tensor) and isinstance(sk, torch.Tensor)
            and sq.dtype == sk.dtype and sq.dtype in (torch.float16, torch.bfloat16)):
        return q, k, False
    if _single_user(q) is not mm or _single_user(k) is not k_consumer or q is k:
        return q, k, False
    nodes += [q, k]
    return cq[0], ck[0], True


def _read_softmax_form(softmax, mm, chain, tail, pv, options) -> AttentionOperands:
    what = "hand-written attention"
    rank = val(mm).dim()
    a, b = mm.args[0], mm.args[1]
    nodes = [mm, softmax, pv]
    scale = 1.0
    # q side: q [* c]
    sc = _scaled(a)
    if sc is not None and _single_user(a) is mm and a is not b:
        nodes.append(a)
        a, f = sc
        scale *= f
    # k side: k.transpose(-1, -2) [* c], (k * c).transpose(-1, -2), or K^T as given
    k, k_transposed, consumer = b, True, mm
    for _ in range(3):
        if not isinstance(k, fx.Node) or k is a or _single_user(k) is not consumer:
            break
        sc = _scaled(k)
        if sc is not None:
            nodes.append(k)
            consumer, (k, f) = k, sc
            scale *= f
            continue
        if k_transposed and _is_last_two_transpose(k, rank):
            nodes.append(k)
            consumer, k, k_transposed = k, k.args[0], False
            continue
        break
    q = a
    q, k, upcast = _through_upcasts(q, mm, k, consumer, nodes)
    # logits: [casts | scalings | number shifts]* then at most one bias
    fill = fill_value = None           # one masked_fill(mask, -inf)
    add_biases = []                    # up to two additive biases: one may be a causal mask
    pre_cap, shifted = None, False     # the scale before a tanh soft-cap; a shift before it
    dtype_in = val(q).dtype
    for n in chain:
        c = _cast_of(n)
        if c is not None:
            if c[1] != torch.float32 and c[1] != dtype_in:
                raise UnsupportedRegion(f"{what}: logits cast to {c[1]}")
            nodes.append(n)
            continue
        src = [x for x in n.args if isinstance(x, fx.Node) and (x is mm or x in nodes)]
        if len(src) != 1:
            raise UnsupportedRegion(f"{what}: {n.target} combines the logits with "
                                    "another tensor")
        s = src[0]
        sc = _scaled(n)
        if sc is not None and sc[0] is s:
            if add_biases or fill is not None:
                raise UnsupportedRegion(f"{what}: the logits are scaled after the mask "
                                        "(the kernel scales before adding it)")
            scale *= sc[1]
            nodes.append(n)
            continue
        if _call(n, aten.add.Tensor, aten.add.Scalar) and len(n.args) == 2:
            if n.kwargs.get("alpha", 1) != 1:
                raise UnsupportedRegion(f"{what}: add with alpha")
            other = n.args[1] if n.args[0] is s else n.args[0]
            if _number(other) is not None:        # softmax is shift-invariant
                shifted = shifted or pre_cap is None      # a tanh after it is not
                nodes.append(n)
                continue
            if len(add_biases) == 2:
                raise UnsupportedRegion(f"{what}: more than two biases are added to the logits")
            add_biases.append(other)
            nodes.append(n)
            continue
        if _call(n, aten.tanh.default) and len(n.args) == 1:    # c * tanh(x / c): a soft-cap
            if not SOFTCAP:
                raise UnsupportedRegion(f"{what}: a tanh soft-cap on the logits (the Hopper kernel's "
                                        "is switched off: partition/attention_forms.SOFTCAP)")
            if pre_cap is not None or add_biases or fill is not None or shifted:
                raise UnsupportedRegion(f"{what}: a second tanh, or a bias, mask or shift before "
                                        "the tanh soft-cap (the kernel caps the scaled logits, "
                                        "then adds the mask)")
            pre_cap, scale = scale, 1.0
            nodes.append(n)
            continue
        if _call(n, aten.masked_fill.Scalar) and n.args[0] is s and len(n.args) == 3:
            value, ldt = _number(n.args[2]), val(s).dtype
            # MPT fills fp32 logits (its fp32 ALiBi bias promoted them) with fp16's
            # finfo.min: like finfo.min where every row keeps a key (exp(-65504 - max)
            # underflows to 0 unless the row's logits are all below -65400)
            lowest = torch.finfo(ldt).min
            if value is not None and ldt == torch.float32 and lowest < value <= torch.finfo(torch.float16).min:
                value = lowest
            if value is None or not (value == -math.inf or value == lowest):
                raise UnsupportedRegion(f"{what}: masked_fill with {n.args[2]!r} (only -inf or the "
                                        f"logits' finfo.min, {lowest:g} for {ldt}, or fp16's on fp32 "
                                        "logits, mask the kernel's way)")
            if fill is not None:
                raise UnsupportedRegion(f"{what}: more than one masked_fill on the logits")
            fill, fill_value = n.args[1], value
            nodes.append(n)
            continue
        raise UnsupportedRegion(f"{what}: {n.target} between q @ k^T and the softmax")
    # softmax and what follows it: a cast back to the input dtype
    for n in tail:
        c = _cast_of(n)
        if c is not None and c[1] == dtype_in:
            nodes.append(n)
            continue
        if _call(n, aten.dropout.default, aten.native_dropout.default):
            raise UnsupportedRegion(f"{what}: dropout (p={n.args[1]}) on the probabilities")
        raise UnsupportedRegion(f"{what}: {n.target} between the softmax and p @ v")
    if val(pv.args[0]).dtype != dtype_in:
        raise UnsupportedRegion(f"{what}: p @ v in {val(pv.args[0]).dtype} on {dtype_in} inputs")
    for n, w in ((mm, "q @ k^T"), (pv, "p @ v")):
        if val(n).dim() != rank or val(n.args[0]).dim() != rank or val(n.args[1]).dim() != rank:
            raise UnsupportedRegion(f"{what}: {w} is not a rank-{rank} batched matmul")
    if val(mm).dtype != dtype_in and not upcast:
        raise UnsupportedRegion(f"{what}: q @ k^T in {val(mm).dtype}")
    softcap = 0.0
    if pre_cap is not None:           # post * tanh(pre * s): cap post, scale pre * post
        if not (pre_cap > 0 and scale > 0):
            raise UnsupportedRegion(f"{what}: a tanh soft-cap with the scales {pre_cap:g} inside "
                                    f"and {scale:g} outside (the kernel takes both > 0)")
        softcap, scale = scale, pre_cap * scale
    ops = AttentionOperands("softmax_attention", q, k, pv.args[1], nodes, pv, scale,
                            k_transposed=k_transposed, softcap=softcap)
    lq, lk = val(mm).shape[-2], val(mm).shape[-1]
    window = window_ok(options, q, pv.args[1])
    add_bias = _one_bias(ops, add_biases, fill, lq, lk)
    folded_fill = None
    if fill is not None:
        if not isinstance(fill, fx.Node) or _tensor(fill, "the mask").dtype != torch.bool:
            raise UnsupportedRegion(f"{what}: masked_fill with a mask that is not boolean")
        folded_fill = _fold_mask(fill, "bool_masked", lq, lk, window)
        if folded_fill is not None and fill_value != -math.inf and folded_fill[0] == "bottom_right" \
                and not (static_int(lq) is not None and static_int(lk) is not None
                         and static_int(lq) <= static_int(lk)):
            folded_fill = None            # finfo.min fills rows with no key softly
        if folded_fill is not None:
            _apply_fold(ops, folded_fill, fill, "bool_masked", "mask")
        elif fill_value != -math.inf:
            raise UnsupportedRegion(f"{what}: masked_fill with finfo.min and a mask that is not a "
                                    "compile-time causal pattern (rows with no key would differ)")
        elif add_bias is not None:
            raise UnsupportedRegion(f"{what}: a bias and a boolean mask that is not a "
                                    "compile-time causal pattern (the kernel takes one bias)")
        else:
            ops.bias, ops.bias_kind = fill, "bool_masked"
    if add_bias is not None:
        if not isinstance(add_bias, fx.Node):
            raise UnsupportedRegion(f"{what}: the bias is not a tensor")
        folded = (_fold_mask(add_bias, "float", lq, lk, window)
                  if folded_fill is None and ops.mask is None else None)
        if folded is not None:
            _apply_fold(ops, folded, add_bias, "float", "mask")
        else:
            ops.bias, ops.bias_kind = add_bias, "float"
            if add_bias.meta.get(bias_sum.META_KEY):
                ops.notes.append(bias_sum.NOTE)
    ops.output, extra, ops.out_layout = _absorb_output(pv, rank)
    ops.nodes += extra
    return ops
