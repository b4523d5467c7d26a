"""Attention partition and region mapping (no nvcc, no GPU).

The mapping is checked numerically: a mapped call's CoAttentionArgs are run on the
CPU the way the kernel reads them (tests/attention_cases.emulate: strides, bias
capacity and alignment, causal modes) and compared with a float64 reference.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from attention_cases import (
    SuiteModel,
    case_id,
    case_inputs,
    conformance_cases,
    extra_cases,
    reference,
    rel_err_nan,
    run_on_cpu,
    suite_inputs,
)
from helpers import Fn

from cutlass_offload.capture import capture
from cutlass_offload.ir import AttentionRegion
from cutlass_offload.partition import kv_groups, partition
from cutlass_offload.runtime.attention_region import AttentionRegionModule
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.select import select

H = torch.float16
TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-4}


def parts(fn, *inputs, dynamic_shapes=None):
    cap = capture(Fn(fn), inputs, dynamic_shapes=dynamic_shapes)
    return partition(cap.graph_module), cap


def qkv(b=2, n=4, s=16, skv=None, h=64, hv=None, dtype=H, layout="bnsh"):
    skv, hv = skv or s, hv or h
    if layout == "bsnh":
        return (torch.randn(b, s, n, h, dtype=dtype), torch.randn(b, skv, n, h, dtype=dtype),
                torch.randn(b, skv, n, hv, dtype=dtype))
    return (torch.randn(b, n, s, h, dtype=dtype), torch.randn(b, n, skv, h, dtype=dtype),
            torch.randn(b, n, skv, hv, dtype=dtype))


def attention_modules(gm):
    return [m for m in gm.modules() if isinstance(m, AttentionRegionModule)]


def run_emulated(monkeypatch, compiled_gm):
    """Make the graph's attention regions run on the CPU emulator; returns the call log."""
    log = []

    def forward(self, *xs):
        out, ran = run_on_cpu(self, xs)
        log.append((self.region.name, ran))
        return out
    monkeypatch.setattr(AttentionRegionModule, "forward", forward)
    return log


# ----------------------------------------------------------------------- matching

def test_sdpa_is_one_region_with_the_transpose_back():
    q, k, v = qkv(layout="bsnh")
    p, _ = parts(lambda q, k, v: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2).reshape(2, 16, -1),
        q, k, v)
    (r,) = p.regions
    assert isinstance(r, AttentionRegion) and r.form == "sdpa" and not p.fallbacks
    assert r.out_layout == "bmhk" and r.nodes[0] == "scaled_dot_product_attention"
    pr = r.problem
    assert (pr.heads, pr.seq_q, pr.seq_kv, pr.head_dim, pr.head_dim_v, pr.batch) == (4, 16, 16, 64, 64, 2)
    assert pr.scale == pytest.approx(1 / 8) and pr.causal == "none" and pr.align == 8


def test_hand_written_attention_is_one_region_before_the_gemm_anchors():
    def fn(q, k, v, m):
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(64) + m
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        return torch.matmul(p, v).permute(0, 2, 1, 3).contiguous().view(2, 16, -1)
    q, k, v = qkv()
    p, cap = parts(fn, q, k, v, torch.zeros(2, 1, 1, 16, dtype=H))
    (r,) = p.regions                       # the two matmuls are not GEMM regions
    assert r.form == "softmax_attention" and not p.fallbacks
    ops = {n.name: n.target for n in cap.graph_module.graph.nodes}
    assert sum(ops[n] is torch.ops.aten.matmul.default for n in r.nodes) == 2
    assert r.bias == "xs_3" and r.bias_kind == "float" and r.problem.bias_broadcast == ("heads", "queries")
    assert r.problem.scale == pytest.approx(1 / 8) and r.out_layout == "bmhk"
    assert not r.k_transposed             # k.transpose(-1, -2) joined the region


def test_hand_written_forms_scale_on_q_bmm_and_transposed_key_input():
    def fn(q, kt, v):                     # the model keeps K^T; q scaled before the matmul
        s = torch.bmm(q * 0.25, kt) * 0.5
        return torch.bmm(torch.softmax(s, dim=-1), v)
    q, kt, v = torch.randn(8, 16, 32, dtype=H), torch.randn(8, 32, 24, dtype=H), torch.randn(8, 24, 32, dtype=H)
    p, _ = parts(fn, q, kt, v)
    (r,) = p.regions
    assert r.rank == 3 and r.k_transposed and r.problem.scale == pytest.approx(0.125)
    assert (r.problem.heads, r.problem.batch, r.problem.seq_kv) == (1, 8, 24)


def test_a_softmax_that_is_not_attention_is_left_alone():
    p, _ = parts(lambda x, w: torch.softmax(x @ w, dim=-1), torch.randn(4, 8, 16, dtype=H),
                 torch.randn(16, 16, dtype=H))
    assert not any(isinstance(r, AttentionRegion) for r in p.regions)
    assert not any(f.op == "softmax_attention" for f in p.fallbacks)


# --------------------------------------------------------------------- causal, scale

def test_causal_and_scale_are_read():
    q, k, v = qkv(s=16, skv=24)
    p, _ = parts(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3), q, k, v)
    (r,) = p.regions
    assert r.problem.causal == "top_left" and r.problem.scale == pytest.approx(0.3)
    assert r.out_layout == "strided" and r.mask is None

    def br(q, k, v):
        m = torch.ones(16, 24, dtype=torch.bool).tril(diagonal=24 - 16)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    p, _ = parts(br, q, k, v)
    (r,) = p.regions
    assert r.problem.causal == "bottom_right" and r.bias is None
    assert r.mask is not None and not r.mask_check          # static: folded for good

    p, _ = parts(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=-0.5), q, k, v)
    (r,) = p.regions
    assert r.negate and r.problem.scale == 0.5 and "negative scale" in r.notes[0]


def test_float_causal_mask_and_other_diagonals():
    q, k, v = qkv(s=16, skv=16)

    def additive(q, k, v):               # transformers' eager form: finfo.min above the diagonal
        m = torch.full((16, 16), torch.finfo(H).min, dtype=H).triu(1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    (r,) = parts(additive, q, k, v)[0].regions
    assert r.problem.causal == "top_left" and r.bias is None and r.mask_kind == "float"

    def shifted(q, k, v):                # diagonal 3: not a kernel pattern -> a bias
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(16, 16, dtype=torch.bool).tril(3))
    (r,) = parts(shifted, q, k, v)[0].regions
    assert r.problem.causal == "none" and r.bias_kind == "bool_keep" and r.problem.bias == "add"


# ------------------------------------------------------------------- fallbacks

def test_dropout_gqa_and_odd_head_dims_stay_in_pytorch_with_reasons():
    q, k, v = qkv()
    p, _ = parts(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1), q, k, v)
    assert not p.regions and "dropout_p=0.1" in p.fallbacks[0].reason

    k2, v2 = torch.randn(2, 2, 16, 64, dtype=H), torch.randn(2, 2, 16, 64, dtype=H)
    gqa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)   # noqa: E731
    p, _ = parts(gqa, q, k2, v2)
    assert [r.problem.kv_group for r in p.regions] == [2]        # read in place (kv_groups.py)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kv_groups, "GQA_IN_PLACE", False)
        p, _ = parts(gqa, q, k2, v2)
    assert not p.regions and "grouped-query" in p.fallbacks[0].reason

    k1, v1 = torch.randn(2, 1, 16, 64, dtype=H), torch.randn(2, 1, 16, 64, dtype=H)
    p, _ = parts(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), q, k1, v1)
    assert len(p.regions) == 1             # one K/V head for all: stride 0

    q33, k33, v33 = qkv(h=33)
    p, _ = parts(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q33, k33, v33)
    plan = select(p, "sm80")
    assert not plan.regions and "not a multiple of 4" in plan.fallbacks[0].reason
    assert plan.fallbacks[0].op == "sdpa"


def test_hand_written_refusals_leave_the_matmuls_to_gemm():
    def dropout(q, k, v):
        pr = F.dropout(torch.softmax(q @ k.transpose(-1, -2) * 0.125, dim=-1), 0.1, training=True)
        return pr @ v
    p, _ = parts(dropout, *qkv())
    assert not any(isinstance(r, AttentionRegion) for r in p.regions)
    assert any(f.op == "softmax_attention" and "dropout" in f.reason for f in p.fallbacks)

    def scaled_after_bias(q, k, v, b):
        return torch.softmax((q @ k.transpose(-1, -2) + b) * 0.125, dim=-1) @ v
    p, _ = parts(scaled_after_bias, *qkv(), torch.randn(16, 16, dtype=H))
    assert any("scaled after the mask" in f.reason for f in p.fallbacks)


# ------------------------------------------------------------------------ mapping

def test_bsnh_inputs_map_in_place_with_their_strides():
    q, k, v = qkv(layout="bsnh", s=24, skv=40)
    p, cap = parts(lambda q, k, v: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)), q, k, v)
    gm = offload(cap.graph_module, select(p, "sm80"), library_path=None)
    (mod,) = attention_modules(gm)
    q, k, v = qkv(layout="bsnh", s=24, skv=40)
    out, args, keep = mod._map((q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)))
    assert (args.q, args.k, args.v) == (q.data_ptr(), k.data_ptr(), v.data_ptr())    # no copies
    assert (args.q_stride_batch, args.q_stride_seq, args.q_stride_head) == (q.stride(0), q.stride(1), q.stride(2))
    assert (args.k_stride_batch, args.k_stride_seq, args.k_stride_head) == (k.stride(0), k.stride(1), k.stride(2))
    assert (args.batch, args.heads, args.seq_q, args.seq_kv, args.head_dim) == (2, 4, 24, 40, 64)
    assert out.shape == (2, 4, 24, 64) and args.out == out.data_ptr()
    assert (args.out_stride_batch, args.out_stride_seq, args.out_stride_head) == (24 * 4 * 64, 4 * 64, 64)
    assert args.bias is None and args.causal == 0 and mod.copies == 0


def test_calls_that_do_not_fit_are_refused():
    q, k, v = qkv()
    p, cap = parts(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)
    gm = offload(cap.graph_module, select(p, "sm80"), library_path=None)
    (mod,) = attention_modules(gm)
    assert mod._map((q.float(), k.float(), v.float())) is None          # dtype
    assert mod._map(qkv(h=32)) is None                                  # head dim
    assert mod._map(qkv(n=8)) is None                                   # heads
    assert mod._map((q, k[:, :, :0], v[:, :, :0])) is None               # no keys


def test_suite_cases_are_one_region_each_and_compute_the_reference(monkeypatch):
    """Guards the GPU suite (tests/gpu/test_attention.py) on the CPU: every case is one
    attention region, and every region's mapped call, run as the kernel reads its
    arguments, matches the float64 reference; no call falls back."""
    cases = conformance_cases() + extra_cases()
    cap = capture(SuiteModel(cases), suite_inputs(cases))
    plan = select(partition(cap.graph_module), "sm90a")
    assert len(plan.regions) == len(cases) and not plan.fallbacks, plan.fallbacks
    assert all(isinstance(r, AttentionRegion) for r in plan.regions)
    families = [k.config.family for k in plan.distinct_kernels]
    # sm90a: the Hopper kernel takes the f16 / bf16 cases without bias (emit/attention_sm90.py)
    assert (families.count("cutlass2x_sm80"), families.count("cutlass3x_sm90")) == (7, 6), \
        [k.name for k in plan.distinct_kernels]
    gm = offload(cap.graph_module, plan, library_path=None)
    log = run_emulated(monkeypatch, gm)
    model = SuiteModel(cases)
    inputs = suite_inputs(cases, seed=7)
    with torch.no_grad():
        outs = gm(*inputs)
    assert len(log) == len(cases) and all(ran for _, ran in log), [n for n, ran in log if not ran]
    bad = []
    for c, xs, out in zip(cases, model.split(inputs), outs):
        ref = reference(c, *xs)
        err = rel_err_nan(out, ref)
        if out.shape != ref.shape or not err <= TOL[out.dtype]:
            bad.append(f"{case_id(c)}: {tuple(out.shape)} rel err {err:.2e}")
    assert not bad, "\n".join(bad)


def test_dynamic_sequence_length(monkeypatch):
    """The "s": "a" conformance entries: s exported dynamic, run at several lengths."""
    (c,) = [c for c in conformance_cases() if c["dynamic"] and c["dtype"] == "fp16"]
    model = SuiteModel([c])
    s = torch.export.Dim("s", min=2, max=64)
    cap = capture(model, case_inputs(c), dynamic_shapes=(({1: s}, None, None),))   # *xs
    plan = select(partition(cap.graph_module), "sm80")
    (r,) = plan.regions
    assert r.problem.seq_q is None and r.problem.batch == c["b"]
    gm = offload(cap.graph_module, plan, library_path=None)
    log = run_emulated(monkeypatch, gm)
    for n in (10, 33, 50):
        xs = case_inputs(c, s=n, seed=n)
        (out,) = gm(*xs)
        assert out.shape == (c["b"], n, c["n"], c["h_v"])
        assert rel_err_nan(out, reference(c, *xs)) <= TOL[H]
    assert [ran for _, ran in log] == [True] * 3


def test_mask_folded_at_dynamic_sizes_is_checked_per_shape(monkeypatch):
    """A causal mask built from the dynamic sequence length is folded at the example
    size and checked again, once, for each new shape."""
    def fn(q, k, v):
        n = q.shape[2]
        m = torch.arange(n)[:, None] >= torch.arange(n)[None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    s = torch.export.Dim("s", min=2, max=64)
    q, k, v = qkv(s=16)
    p, cap = parts(fn, q, k, v, dynamic_shapes=(({2: s}, {2: s}, {2: s}),))   # *xs
    (r,) = p.regions
    assert r.problem.causal == "top_left" and r.mask_check and r.bias is None
    gm = offload(cap.graph_module, select(p, "sm80"), library_path=None)
    log = run_emulated(monkeypatch, gm)
    (mod,) = attention_modules(gm)
    for n in (12, 12, 30):
        q, k, v = qkv(s=n)
        out = gm(q, k, v)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        assert rel_err_nan(out, ref) <= TOL[H]
    assert all(ran for _, ran in log) and len(mod._mask_ok) == 2
    # a mask that is not the folded pattern at a shape sends that call to PyTorch
    assert not mod._mask_fits(torch.ones(20, 20, dtype=torch.bool), 20, 20)


def test_negative_scale_and_rows_without_keys(monkeypatch):
    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=-0.3)
    q, k, v = qkv(s=8, skv=20, dtype=torch.float32)
    m = torch.rand(2, 1, 8, 20) > 0.5
    m[1, :, 3] = False                                   # a query with no key: 0 in SDPA
    p, cap = parts(fn, q, k, v, m)
    gm = offload(cap.graph_module, select(p, "sm80"), library_path=None)
    log = run_emulated(monkeypatch, gm)
    out = gm(q, k, v, m)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=m, scale=-0.3)
    assert log == [(p.regions[0].name, True)]
    assert torch.all(out[1, :, 3] == 0) and rel_err_nan(out, ref) <= TOL[torch.float32]
    (mod,) = attention_modules(gm)
    assert mod.copies == 2                               # -q and the padded 0/-inf bias


# --------------------------------------------------------------- built-in models

@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_transformers_sdpa_models_offload_every_attention(monkeypatch, name):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "bert":
        cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=128, attn_implementation="sdpa")
        hf = transformers.BertModel(cfg, add_pooling_layer=False)
    else:
        cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, use_cache=False,
                                      attn_implementation="sdpa")
        hf = transformers.GPT2Model(cfg)
    model = Fn(lambda ids: hf(input_ids=ids).last_hidden_state)
    model.hf = hf                          # a submodule: eval() reaches it (no attention dropout)
    ids = torch.randint(0, 1000, (2, 24))
    cap = capture(model, (ids,))
    plan = select(partition(cap.graph_module), "sm80")
    att = [r for r in plan.regions if isinstance(r, AttentionRegion)]
    assert len(att) == 2 and not [f for f in plan.fallbacks if f.op == "sdpa"]
    assert {r.problem.causal for r in att} == {"top_left" if name == "gpt2" else "none"}
    assert all(r.bias is None and r.out_layout == "bmhk" for r in att)
    with torch.no_grad():
        ref = model(ids)
    only_attention = plan.__class__(plan.arch, tuple(att), tuple(
        k for r, k in zip(plan.regions, plan.kernels) if isinstance(r, AttentionRegion)), ())
    gm = offload(cap.graph_module, only_attention, library_path=None)
    log = run_emulated(monkeypatch, gm)
    with torch.no_grad():
        out = gm(ids)
    assert [ran for _, ran in log] == [True, True]
    assert rel_err_nan(out, ref) <= 1e-4


def _hf_split_attention(q, k, v):
    """Hugging Face's head split: each BSNH operand transposed and made contiguous."""
    return F.scaled_dot_product_attention(
        q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(),
        scale=0.125).transpose(1, 2).contiguous().reshape(2, 24, -1)


def test_layout_copies_before_sdpa_join_the_region_and_the_kernel_reads_in_place(monkeypatch):
    q, k, v = qkv(layout="bsnh", s=24)
    p, cap = parts(_hf_split_attention, q, k, v)
    (r,) = p.regions
    assert (r.q, r.k, r.v) == ("transpose", "transpose_1", "transpose_2")
    assert {"contiguous", "contiguous_1", "contiguous_2"} <= set(r.nodes)
    assert any("3 layout copies" in n for n in r.notes) and r.out_layout == "bmhk"
    gm = offload(cap.graph_module, select(p, "sm80"), library_path=None)
    (mod,) = attention_modules(gm)
    q, k, v = qkv(layout="bsnh", s=24)
    _, args, _ = mod._map((q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)))
    assert (args.q, args.k, args.v) == (q.data_ptr(), k.data_ptr(), v.data_ptr()) and mod.copies == 0
    log = run_emulated(monkeypatch, gm)
    out = gm(q, k, v)
    ref = _hf_split_attention(q.double(), k.double(), v.double())
    assert log and all(ran for _, ran in log)
    assert rel_err_nan(out[0] if isinstance(out, (tuple, list)) else out, ref) < TOL[H]


def test_a_layout_copy_used_elsewhere_stays_outside_the_region():
    q, k, v = qkv(layout="bsnh", s=24)

    def fn(q, k, v):
        kc = k.transpose(1, 2).contiguous()
        return F.scaled_dot_product_attention(q.transpose(1, 2), kc, v.transpose(1, 2)), kc * 2
    p, _ = parts(fn, q, k, v)
    (r,) = p.regions
    assert r.k == "contiguous" and "contiguous" not in r.nodes
    assert not any("layout cop" in n for n in r.notes)


def test_a_fallback_names_the_sdpa_call_not_the_copy_before_it():
    """With the layout copies first in the region's nodes, a region left to PyTorch
    still names its SDPA call (which the report's FLOPs are keyed by)."""
    q, k, v = qkv(layout="bsnh", s=24)
    p, _ = parts(_hf_split_attention, q, k, v)
    (r,) = p.regions
    assert r.nodes[0] == "contiguous" and r.anchor == "scaled_dot_product_attention"
    plan = select(p, "sm80").keep(lambda *_: False, lambda *_: "test")
    assert [f.node for f in plan.fallbacks] == ["scaled_dot_product_attention"]


def test_a_constant_factor_on_sdpas_query_becomes_the_regions_scale():
    """whisper's ``(q_proj(x) * scaling).view().transpose()`` before SDPA: the factor
    moves into the region's scale (canonicalize), so the region reads q in place
    instead of a scaled copy; a factor on k (not q's alone) stays in the graph."""
    def fn(x, k, v):
        q = (x * 0.125).view(2, 16, 4, 64).transpose(1, 2).contiguous()
        return F.scaled_dot_product_attention(q, k, v, scale=1.0)
    _, k, v = qkv()
    p, cap = parts(fn, torch.randn(2, 16, 256, dtype=H), k, v)
    (r,) = p.regions
    assert isinstance(r, AttentionRegion) and r.problem.scale == pytest.approx(0.125)
    targets = [n.target for n in cap.graph_module.graph.nodes]
    assert torch.ops.aten.mul.Tensor not in targets
    p2, _ = parts(lambda q, k, v: F.scaled_dot_product_attention(q, k * 0.5, v), *qkv())
    (r2,) = p2.regions
    assert r2.problem.scale == pytest.approx(1 / 8)


def test_one_mask_read_by_many_attentions_is_checked_once(monkeypatch):
    """llama passes one causal mask to all its layers: its pattern is checked once per
    (mask, kind, sizes), not once per SDPA (1.07 of llama's 1.08 s partition on 2 cores
    went to checking it 16 times, session 50); every SDPA still folds it."""
    from cutlass_offload.partition import attention_forms
    calls = []
    real = attention_forms.mask_pattern

    def counted(*a, **kw):
        calls.append(a[1:])
        return real(*a, **kw)
    monkeypatch.setattr(attention_forms, "mask_pattern", counted)

    class Layers(torch.nn.Module):
        def forward(self, q, k, v):
            mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
            for _ in range(3):
                q = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return q
    x = torch.randn(2, 4, 16, 32, dtype=torch.float16)
    part = partition(capture(Layers(), (x, x.clone(), x.clone())).graph_module)
    regions = [r for r in part.regions if isinstance(r, AttentionRegion)]
    assert len(regions) == 3 and {r.problem.causal for r in regions} == {"top_left"}
    assert calls == [("bool_keep", 16, 16)]


def test_attention_hidden_by_an_op_on_the_logits_is_named(monkeypatch):
    """An op the logits walk does not take left the attention as two GEMMs and a
    softmax with no line in the report (fresh-user trial, session 54): the softmax is a
    fallback naming it (here a clamp). The two ops of that trial are attention regions
    since session 55: Gemma 2's tanh soft-cap (tests/unit/test_softcap_attention.py)
    and BLOOM's view of the scores to (B, H, L, S) (partition/head_views.py)."""
    import math

    from cutlass_offload.partition import attention_forms
    monkeypatch.setattr(attention_forms, "SOFTCAP", True)

    def clamped(q, k, v):
        w = torch.clamp(torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5, -30, 30)
        return torch.matmul(torch.softmax(w, -1, dtype=torch.float32).to(q.dtype), v)

    def softcap(q, k, v):
        w = torch.tanh(torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5 / 50) * 50
        return torch.matmul(torch.softmax(w, -1, dtype=torch.float32).to(q.dtype), v)

    def bloom(q, k, v, alibi):
        s = torch.baddbmm(alibi, q, k.transpose(1, 2), alpha=1 / math.sqrt(32)).view(2, 4, 64, 64)
        return torch.bmm(torch.softmax(s, -1, dtype=torch.float32).to(q.dtype).view(8, 64, 64), v)
    q4, q3 = torch.randn(2, 4, 128, 64).half(), torch.randn(8, 64, 32).half()
    part = partition(capture(Fn(clamped), (q4, q4, q4)).graph_module)
    assert sorted(r.form for r in part.regions) == ["matmul", "matmul"]
    (fb,) = part.fallbacks
    assert fb.op == "softmax_attention" and "aten.clamp.default" in fb.reason
    assert "between q @ k^T and the softmax" in fb.reason
    for fn, xs in ((softcap, (q4, q4, q4)), (bloom, (q3, q3, q3, torch.randn(8, 1, 64).half()))):
        part = partition(capture(Fn(fn), xs).graph_module)
        assert [r.form for r in part.regions] == ["softmax_attention"] and not part.fallbacks


def test_fp16_lowest_fill_on_fp32_logits_is_the_causal_mask():
    """MPT fills fp32 logits with fp16's finfo.min (-65504): with a compile-time causal
    mask every row keeps a key, so it masks as finfo.min does (fresh-user trial, session
    55: the reason said only finfo.min was taken)."""
    def fn(q, k, v):
        s = (torch.matmul(q, k.transpose(-1, -2)) * 0.125).float()
        keep_out = torch.ones(64, 64, dtype=torch.bool).triu(1)
        s = s.masked_fill(keep_out, torch.finfo(torch.float16).min)
        return torch.matmul(torch.softmax(s, -1).to(q.dtype), v)

    def other(q, k, v):            # a fill that is neither: stays, with the values named
        s = (torch.matmul(q, k.transpose(-1, -2)) * 0.125).float()
        s = s.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), -1000.0)
        return torch.matmul(torch.softmax(s, -1).to(q.dtype), v)
    q = torch.randn(2, 4, 64, 32).half()
    part = partition(capture(Fn(fn), (q, q, q)).graph_module)
    assert [r.form for r in part.regions] == ["softmax_attention"], part
    assert part.regions[0].problem.causal == "top_left"
    part = partition(capture(Fn(other), (q, q, q)).graph_module)
    (fb,) = [f for f in part.fallbacks if f.op == "softmax_attention"]
    assert "masked_fill with -1000.0" in fb.reason and "-3.40282e+38" in fb.reason
