"""Attention of head dim above 256 as two GEMM regions and a softmax
(partition/wide_attention.py): matching, notes, limits, and the rewritten graph's
arithmetic against float64 SDPA."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import Fn

from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.ir import AttentionRegion, GemmRegion
from cutlass_offload.partition import partition, wide_attention

H = torch.float16


def parts(fn, *inputs, dynamic_batch=False, **opts):
    cap = capture(Fn(fn), inputs, dynamic_batch=dynamic_batch)
    return partition(cap.graph_module, CompileOptions(arch="sm90a", **opts)), cap


def qkv(b=1, n=2, s=32, skv=None, e=512, ev=None, dtype=H):
    skv, ev = skv or s, ev or e
    return (torch.randn(b, n, s, e, dtype=dtype), torch.randn(b, n, skv, e, dtype=dtype),
            torch.randn(b, n, skv, ev, dtype=dtype))


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def test_sdpa_of_head_dim_512_is_two_gemm_regions_with_the_note():
    p, cap = parts(sdpa, *qkv())
    assert not p.fallbacks
    assert [type(r) for r in p.regions] == [GemmRegion, GemmRegion]
    qk, pv = p.regions
    # S = (q * scale) @ k^T: M = 32 queries, N = 32 keys, K = 512, batch 2 heads
    assert (qk.problem.m, qk.problem.n, qk.problem.k, qk.problem.batch) == (32, 32, 512, 2)
    assert (pv.problem.m, pv.problem.n, pv.problem.k, pv.problem.batch) == (32, 512, 32, 2)
    assert pv.problem.layout_b == "row"             # v read as it lies, (keys, head dim)
    for r in (qk, pv):
        assert any("two GEMMs and a softmax" in str(n) for n in r.notes), r.notes
    targets = [n.target for n in cap.graph_module.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.scaled_dot_product_attention.default not in targets
    assert torch.ops.aten.softmax.int in targets   # the softmax stays in the glue


def test_a_dynamic_batch_decomposes_at_its_example_size():
    p, _ = parts(sdpa, *qkv(b=2), dynamic_batch=True)
    assert not p.fallbacks and [type(r) for r in p.regions] == [GemmRegion, GemmRegion]
    assert all(r.problem.batch is None and r.problem.batch_hint == 4 for r in p.regions)
    # the scores at the example's batch: 2 x 2 heads x 32 x 32 fp16 values
    assert any("scores take 8 KiB" in str(n) for n in p.regions[0].notes)


def test_the_rewritten_graph_computes_sdpa():
    q, k, v = qkv(s=48, skv=40, e=320, ev=288)
    _, cap = parts(sdpa, q, k, v)
    got = cap.graph_module(q, k, v)
    got = got[0] if isinstance(got, (tuple, list)) else got
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert got.dtype == H and got.shape == want.shape
    err = (got.double() - want).norm() / want.norm()
    assert err < 3e-3, err


def test_hand_written_wide_attention_leaves_its_matmuls_to_the_gemm_anchors():
    def fn(q, k, v):
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(512)
        return torch.matmul(torch.softmax(s.float(), dim=-1).to(q.dtype), v)
    p, _ = parts(fn, *qkv())
    assert not p.fallbacks and len(p.regions) == 2
    assert all(isinstance(r, GemmRegion) and any("two GEMMs" in str(n) for n in r.notes)
               for r in p.regions)


@pytest.mark.parametrize("case", ["head_dim_256", "option_off", "causal", "scores_too_big"])
def test_other_attentions_keep_the_fused_kernel(case, monkeypatch):
    fn, inputs, opts = sdpa, qkv(), {}
    if case == "head_dim_256":
        inputs = qkv(e=256)
    elif case == "option_off":
        opts = {"decompose_wide_attention": False}
    elif case == "causal":
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    else:
        monkeypatch.setattr(wide_attention, "MAX_SCORES_BYTES", 2 * 32 * 32 * 2 - 1)
    p, _ = parts(fn, *inputs, **opts)
    assert any(isinstance(r, AttentionRegion) for r in p.regions) or p.fallbacks
    assert not any("two GEMMs" in str(n) for r in p.regions for n in r.notes)



def test_the_cli_flag_keeps_the_fused_kernel(tmp_path, monkeypatch):
    from cutlass_offload import cli
    seen = []
    monkeypatch.setattr(cli, "_cmd_compile", lambda a: seen.append(a.decompose_wide_attention) or 0)
    base = ["compile", "mlp", "--out", str(tmp_path / "m"), "--arch", "sm_80"]
    assert cli.main(base) == 0 and cli.main(base + ["--no-decompose-wide-attention"]) == 0
    assert seen == [True, False]
