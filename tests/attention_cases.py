"""Attention test cases: the conformance cases (tests/conformance/tvm_cutlass_cases.json,
restated for PyTorch) plus causal attention with s != s_kv in both alignments, bias
broadcasts over batch / heads / queries, boolean masks, one shared K/V head, the
hand-written form (4-D and 3-D bmm). One SuiteModel runs every case, so one library
holds all their kernels (one build). ``emulate`` runs a mapped call on the CPU the
way the kernel reads CoAttentionArgs (unit tier: the mapping, checked numerically).
"""
import json
import math
from pathlib import Path

import torch

SUITE = json.loads((Path(__file__).parent / "conformance" / "tvm_cutlass_cases.json").read_text())
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _case(**kw):
    c = dict(form="sdpa", layout="bnsh", causal="none", bias=None, mask=None, scale=None,
             kv_heads=None, dtype="fp16", dynamic=False, window=None)
    c.update(kw)
    return c


def conformance_cases(dynamic_s=16) -> list:
    """Dicts: form ("sdpa" / "hand" / "bmm"), layout ("bsnh": q (b, s, n, h) permuted in the
    model, "bnsh"), b, s, s_kv, n, h, h_v, dtype, causal ("none", "top_left",
    "bottom_right"), bias (float bias shape or None), mask (boolean mask shape or None),
    scale (None = PyTorch's default), kv_heads (K/V heads when not n), dynamic (s is a
    dynamic dim: the "s": "a" entries, exported at ``dynamic_s``)."""
    cases = []
    for c in SUITE["attention_offload_tol_1e-2"]:
        for dt in c["dtypes"]:
            dyn = c["s"] == "a"
            cases.append(_case(layout="bsnh", b=c["b"], s=dynamic_s if dyn else c["s"],
                               s_kv=c["s_kv"], n=c["n"], h=c["h"], h_v=c["h_v"], dtype=dt,
                               dynamic=dyn))
    for c in SUITE["attention_causal_fp16_tol_1e-2"]:
        causal = {"TopLeft": "top_left", "BottomRight": "bottom_right"}[c["causal"]]
        # a bias with a causal mask: the hand-written form (SDPA takes one mask)
        cases.append(_case(form="hand" if c["bias"] else "sdpa", b=c["b"], s=c["s"],
                           s_kv=c["s_kv"], n=c["n"], h=c["h"], h_v=c["h_v"], causal=causal,
                           bias=c["bias"]))
    for c in SUITE["attention_scale_fp32_tol_1e-2"]:
        cases.append(_case(b=c["b"], s=c["s"], s_kv=c["s_kv"], n=c["n"], h=c["h"], h_v=c["h_v"],
                           dtype="fp32", bias=c["bias"], scale=c["scale"]))
    return cases


def extra_cases() -> list:
    b, n = 2, 4
    return [
        # causal with s != s_kv, both alignments (h 64: aligned kernel, h 12: not aligned)
        _case(b=b, s=40, s_kv=72, n=n, h=64, h_v=64, causal="top_left"),
        _case(b=b, s=40, s_kv=72, n=n, h=12, h_v=12, causal="bottom_right"),
        _case(b=b, s=72, s_kv=40, n=n, h=12, h_v=12, causal="top_left", layout="bsnh"),
        _case(b=b, s=72, s_kv=40, n=n, h=64, h_v=64, causal="bottom_right"),   # 32 rows see no key
        # float bias broadcast over batch / heads / queries / batch and heads; s_kv 20
        # (rows padded to 24 for the kernel's 16-byte bias reads) and 32 (passed in place)
        _case(b=b, s=24, s_kv=20, n=n, h=64, h_v=64, bias=[1, n, 24, 20]),
        _case(b=b, s=24, s_kv=32, n=n, h=64, h_v=64, bias=[b, 1, 24, 32]),
        _case(b=b, s=24, s_kv=20, n=n, h=64, h_v=64, bias=[b, n, 1, 20], layout="bsnh"),
        _case(b=b, s=24, s_kv=32, n=n, h=64, h_v=64, bias=[24, 32]),
        # boolean key-padding mask (batch 0 masks every key: those rows are 0), and a
        # boolean mask per query
        _case(b=b, s=24, s_kv=20, n=n, h=64, h_v=64, mask=[b, 1, 1, 20]),
        _case(b=b, s=24, s_kv=32, n=n, h=64, h_v=64, mask=[1, 1, 24, 32], causal="none"),
        # one K/V head shared by every query head (enable_gqa)
        _case(b=b, s=24, s_kv=40, n=n, h=64, h_v=64, kv_heads=1),
        # ... with 65 queries: the sm80 kernel's last query block holds one query, where
        # its shortcut for zero K/V head strides would drop the causal mask and read the
        # bias per query instead of per head (emit/attention.py); a bias or fp32 keeps
        # these on the sm80 kernel on sm_90a too
        _case(form="hand", b=b, s=65, s_kv=100, n=n, h=64, h_v=64, kv_heads=1,
              causal="top_left", bias=[1, n, 65, 100]),
        _case(b=b, s=65, s_kv=100, n=n, h=64, h_v=64, kv_heads=1, causal="top_left",
              dtype="fp32"),
        # grouped-query attention, 2 query heads per K/V head, K and V read in place
        # (partition/kv_groups.py): causal (the Hopper kernel on sm_90a), and BSNH with a
        # float bias (the sm80 kernel)
        _case(b=b, s=65, s_kv=65, n=n, h=64, h_v=64, kv_heads=2, causal="top_left"),
        _case(b=b, s=24, s_kv=40, n=n, h=64, h_v=64, kv_heads=2, bias=[b, n, 24, 40], layout="bsnh"),
        # hand-written: 4-D with a boolean padding mask, 3-D bmm (head_to_batch_dim style)
        _case(form="hand", b=b, s=24, s_kv=40, n=n, h=64, h_v=64, mask=[b, 1, 1, 40],
              layout="bsnh"),
        _case(form="bmm", b=b, s=24, s_kv=40, n=n, h=64, h_v=64),
        _case(b=b, s=24, s_kv=40, n=n, h=64, h_v=64, dtype="bf16", causal="top_left"),
    ]


def sliding_window_cases() -> list:
    """Top-left causal masks within a sliding window of ``window`` keys (query i sees keys
    i - W < j <= i, transformers' ``sliding_window``), computed in the model from its
    sizes: SDPA's boolean attn_mask (with grouped K/V heads, in BSNH), the hand-written
    masked_fill, and a window as wide as the rows (plain causal). On sm_90a the window
    folds into the Hopper kernel; on sm_80 the mask stays the sm80 kernel's bias."""
    return [
        _case(b=2, s=200, s_kv=200, n=4, h=64, h_v=64, causal="top_left", window=48),
        _case(b=1, s=130, s_kv=130, n=4, h=128, h_v=128, causal="top_left", window=100,
              kv_heads=2, layout="bsnh", dtype="bf16"),
        _case(form="hand", b=2, s=96, s_kv=96, n=2, h=64, h_v=64, causal="top_left", window=32),
        _case(b=1, s=64, s_kv=64, n=2, h=64, h_v=64, causal="top_left", window=100),
    ]


def case_id(c) -> str:
    parts = [c["form"], c["layout"], f"b{c['b']}s{c['s']}kv{c['s_kv']}n{c['n']}h{c['h']}v{c['h_v']}",
             c["dtype"], c["causal"]]
    if c["bias"]:
        parts.append("bias" + "x".join(map(str, c["bias"])))
    if c["mask"]:
        parts.append("mask" + "x".join(map(str, c["mask"])))
    if c["scale"] is not None:
        parts.append(f"scale{c['scale']}")
    if c["kv_heads"]:
        parts.append(f"kvheads{c['kv_heads']}")
    if c.get("window"):
        parts.append(f"win{c['window']}")
    return "_".join(parts)


# ----------------------------------------------------------------------- the model

def case_inputs(c, device="cpu", seed=0, s=None):
    """(q, k, v[, bias or mask]) of one case, fresh random values (s: another seq length)."""
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[c["dtype"]]
    b, n, h, hv, skv = c["b"], c["n"], c["h"], c["h_v"], c["s_kv"]
    s = s or c["s"]
    nk = c["kv_heads"] or n

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dt).to(device)

    if c["form"] == "bmm":
        xs = [rnd(b * n, s, h), rnd(b * n, skv, h), rnd(b * n, skv, hv)]
    elif c["layout"] == "bsnh":
        xs = [rnd(b, s, n, h), rnd(b, skv, nk, h), rnd(b, skv, nk, hv)]
    else:
        xs = [rnd(b, n, s, h), rnd(b, nk, skv, h), rnd(b, nk, skv, hv)]
    if c["bias"]:
        xs.append(rnd(*c["bias"]))
    if c["mask"]:
        m = torch.rand(*c["mask"], generator=g) > 0.3
        if c["mask"][0] > 1:
            m[0] = False                   # batch 0: no key at all
            m[1:, ..., 0] = True           # the others: at least one
        xs.append(m.to(device))
    return tuple(xs)


def _causal_keep(s, skv, causal, device, window=None):
    if causal == "none":
        return None
    diag = 0 if causal == "top_left" else skv - s
    keep = torch.ones(s, skv, dtype=torch.bool, device=device).tril(diagonal=diag)
    if window:                    # and keys j > i - window (transformers' sliding window)
        keep = keep & ~torch.ones(s, skv, dtype=torch.bool, device=device).tril(diagonal=diag - window)
    return keep


def case_forward(c, q, k, v, extra=None):
    """What the case computes, in PyTorch (the model's code)."""
    F = torch.nn.functional
    if c["layout"] == "bsnh" and c["form"] != "bmm":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    s, skv = q.shape[-2], k.shape[-2]
    if c["form"] == "sdpa":
        kw = {} if c["scale"] is None else {"scale": c["scale"]}
        if c["kv_heads"]:
            kw["enable_gqa"] = True
        mask = extra
        if c.get("window"):
            mask = _causal_keep(s, skv, c["causal"], q.device, c["window"])
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
        elif c["causal"] == "top_left":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
        else:
            if c["causal"] == "bottom_right":
                mask = _causal_keep(s, skv, "bottom_right", q.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    else:
        scale = c["scale"] if c["scale"] is not None else 1 / math.sqrt(q.shape[-1])
        if c["form"] == "bmm":
            scores = torch.bmm(q, k.transpose(1, 2)) * scale
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        if c["bias"]:
            scores = scores + extra
        if c["mask"]:
            scores = scores.masked_fill(~extra, float("-inf"))
        keep = _causal_keep(s, skv, c["causal"], q.device, c.get("window"))
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        p = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = torch.bmm(p, v) if c["form"] == "bmm" else torch.matmul(p, v)
    if c["layout"] == "bsnh" and c["form"] != "bmm":
        out = out.transpose(1, 2)
    return out


def reference(c, q, k, v, extra=None):
    """float64 reference: rows that see no key are 0 for SDPA, NaN for a hand-written softmax."""
    q, k, v = q.double(), k.double(), v.double()
    if c["layout"] == "bsnh" and c["form"] != "bmm":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if c["kv_heads"]:
        g = q.shape[1] // k.shape[1]          # query heads per K/V head, each K/V head's in a row
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s, skv = q.shape[-2], k.shape[-2]
    scale = c["scale"] if c["scale"] is not None else 1 / math.sqrt(q.shape[-1])
    logits = q @ k.transpose(-1, -2) * scale
    if c["bias"]:
        logits = logits + extra.double()
    if c["mask"]:
        logits = logits.masked_fill(~extra, float("-inf"))
    keep = _causal_keep(s, skv, c["causal"], q.device, c.get("window"))
    if keep is not None:
        logits = logits.masked_fill(~keep, float("-inf"))
    p = torch.softmax(logits, dim=-1)
    if c["form"] == "sdpa":
        p = torch.nan_to_num(p, nan=0.0)
    out = p @ v
    if c["layout"] == "bsnh" and c["form"] != "bmm":
        out = out.transpose(1, 2)
    return out


class SuiteModel(torch.nn.Module):
    """Every case in one graph: forward(*inputs of every case) -> tuple of outputs."""

    def __init__(self, cases):
        super().__init__()
        self.cases = cases
        self.arity = [3 + bool(c["bias"] or c["mask"]) for c in cases]

    def forward(self, *xs):
        outs, i = [], 0
        for c, a in zip(self.cases, self.arity):
            outs.append(case_forward(c, *xs[i:i + a]))
            i += a
        return tuple(outs)

    def split(self, xs):
        out, i = [], 0
        for a in self.arity:
            out.append(xs[i:i + a])
            i += a
        return out


def suite_inputs(cases, device="cpu", seed=0):
    return tuple(x for i, c in enumerate(cases) for x in case_inputs(c, device, seed + i))


def rel_err_nan(out, ref) -> float:
    """Norm-wise relative error over the finite reference entries; inf when NaNs differ."""
    out, ref = out.double(), ref.double()
    nan = torch.isnan(ref)
    if not torch.equal(nan, torch.isnan(out)):
        return float("inf")
    o, r = out[~nan], ref[~nan]
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


# ------------------------------------------------------------------- CPU emulation

ACCESS_BYTES = 16


def _storage_view(ptr, pool, dtype, shape, strides):
    esize = torch.empty((), dtype=dtype).element_size()
    for t in pool:
        st = t.untyped_storage()
        base = st.data_ptr()
        if base <= ptr < base + st.nbytes():
            assert (ptr - base) % esize == 0, "pointer not on an element"
            flat = torch.empty(0, dtype=dtype).set_(st, 0, (st.nbytes() // esize,), (1,))
            off = (ptr - base) // esize
            last = off + sum((n - 1) * s for n, s in zip(shape, strides) if n > 0)
            assert last < flat.numel(), "the kernel would read past the tensor"
            return flat.as_strided(shape, strides, off)
    raise AssertionError("a pointer into no tensor the call keeps alive")


def emulate(mod, args, keep, out):
    """Run a mapped call (``mod._map``'s args) on the CPU as the kernel reads its arguments:
    returns False where the kernel's ``run`` would refuse the call (CO_CANNOT_IMPLEMENT),
    else writes ``out`` (float64 math, P rounded like the kernel does not: exact softmax)."""
    k = mod.kernel
    dt = mod._dtype
    pool = [t for t in keep if isinstance(t, torch.Tensor)] + [out]
    acc, ab = k.access, ACCESS_BYTES // torch.empty((), dtype=dt).element_size()
    a = args
    b, h, sq, skv, e, ev = a.batch, a.heads, a.seq_q, a.seq_kv, a.head_dim, a.head_dim_v
    if not (a.scale > 0 and math.isfinite(a.scale)) or skv < 1 or e % acc or ev % acc:
        return False
    if a.causal == 2 and sq > skv:
        return False
    if k.config.family == "cutlass3x_sm90":
        # emit/attention_sm90.py's run: one head dim up to the tile, no bias, the
        # compiled mask (CausalFusion is top-left and sees no key past seq_kv)
        if e != ev or e > k.head_tile or a.bias:
            return False
        if (a.causal != 0) != k.causal or (a.causal == 1 and sq > skv) or (
                a.causal == 2 and sq != skv):
            return False
    for p, strides in ((a.q, (a.q_stride_batch, a.q_stride_seq, a.q_stride_head)),
                       (a.k, (a.k_stride_batch, a.k_stride_seq, a.k_stride_head)),
                       (a.v, (a.v_stride_batch, a.v_stride_seq, a.v_stride_head))):
        if p % (acc * mod._esize) or any(s < 0 or s % acc for s in strides):
            return False
    if a.out_stride_head != ev or a.out_stride_seq < h * ev or (
            b > 1 and a.out_stride_batch != sq * a.out_stride_seq):
        return False
    if sq == 0 or b == 0:
        return True
    g = k.kv_group                  # query head i reads K/V head i // g (the strides are per K/V head)
    if h % g:
        return False
    qv = _storage_view(a.q, pool, dt, (b, sq, h, e), (a.q_stride_batch, a.q_stride_seq, a.q_stride_head, 1))
    kv = _storage_view(a.k, pool, dt, (b, skv, h // g, e), (a.k_stride_batch, a.k_stride_seq, a.k_stride_head, 1))
    vv = _storage_view(a.v, pool, dt, (b, skv, h // g, ev), (a.v_stride_batch, a.v_stride_seq, a.v_stride_head, 1))
    ov = _storage_view(a.out, pool, dt, (b, sq, h, ev), (a.out_stride_batch, a.out_stride_seq, ev, 1))
    q4, k4, v4 = (t.permute(0, 2, 1, 3).double() for t in (qv, kv, vv))
    k4, v4 = k4.repeat_interleave(g, dim=1), v4.repeat_interleave(g, dim=1)
    logits = q4 @ k4.transpose(-1, -2) * float(torch.tensor(a.scale, dtype=torch.float32))
    if a.bias:
        bs = (a.bias_stride_batch, a.bias_stride_head, a.bias_stride_query)
        if a.bias % ACCESS_BYTES or any(s % ab for s in bs):
            return False
        cap = a.bias_kv_capacity or skv
        if cap < -(-skv // ab) * ab:
            return False
        _storage_view(a.bias, pool, dt, (b, h, sq, cap), bs + (1,))       # rows readable
        logits = logits + _storage_view(a.bias, pool, dt, (b, h, sq, skv), bs + (1,)).double()
    if a.causal:
        i = torch.arange(sq)[:, None]
        j = torch.arange(skv)[None, :]
        keep_ = j <= i if a.causal == 1 else j <= i + (skv - sq)
        if getattr(k, "window", 0):           # the Hopper kernel's compiled window
            keep_ = keep_ & (j > i - k.window)
        logits = logits.masked_fill(~keep_, float("-inf"))
    p = torch.softmax(logits, dim=-1)              # a row of -inf: NaN, as the kernel's 0/0
    ov.copy_((p @ v4).permute(0, 2, 1, 3).to(dt))
    return True


def run_on_cpu(mod, xs):
    """One call of an AttentionRegionModule on CPU tensors: (result, ran the 'kernel')."""
    mapped = mod._map(tuple(xs))
    if mapped is None:
        return mod.fallback(*xs), False
    out, args, keep = mapped
    base = out._base if out._base is not None else out
    if not emulate(mod, args, keep, base):
        return mod.fallback(*xs), False
    return mod._launched(out, keep), True
