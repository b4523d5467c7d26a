"""GPU: attention regions (conformance cases and extras) run offloaded and match a
float64 reference computed with PyTorch ops from the same inputs (tests/attention_cases.py).

One SuiteModel holds every case, so one library holds all their kernels (8 distinct:
f16 aligned / not aligned / aligned + bias / head dim 256 with workspace, f32 plain /
bias / head dim 256, bf16). Inputs are fresh random values for each trial and the
allocator is poisoned with NaN, so output rows the kernel does not write show up.
Rows that see no key are 0 in SDPA and NaN in a hand-written softmax, in the
reference as in the offloaded model.
"""
import copy

import pytest
import torch
import torch.nn.functional as F

import cutlass_offload as co
from attention_cases import (DTYPES, SuiteModel, case_id, case_inputs, conformance_cases,
                             extra_cases, reference, rel_err_nan, suite_inputs)
from helpers import TOLERANCE, poison_allocator, rel_err

pytestmark = pytest.mark.gpu
CASES = conformance_cases() + extra_cases()
# the conformance cases' tolerance is 1e-2; fp32 runs as 3xTF32, close to fp32
TOL = {dt: max(tol, 1e-3) for dt, tol in TOLERANCE.items()}


def _regions(compiled):
    return compiled.region_modules()


def _fallback_calls(compiled):
    return sum(m.fallback_calls for m in _regions(compiled))


@pytest.fixture(scope="module")
def suite():
    model = SuiteModel(CASES)
    compiled = co.compile(model, suite_inputs(CASES, "cuda"))
    return model, compiled


def test_every_case_offloaded(suite):
    _, compiled = suite
    assert len(compiled.plan.regions) == len(CASES), compiled.report.format()
    assert not compiled.plan.fallbacks, compiled.report.format()
    assert all(r.form in ("sdpa", "softmax_attention") for r in compiled.plan.regions)
    families = [k.config.family for k in compiled.plan.distinct_kernels]
    # on sm_90a the Hopper kernel (emit/attention_sm90.py) takes the f16 / bf16 cases
    # without bias; the sm80 kernel the rest (tests/unit/test_attention_partition.py)
    expected = (8, 0) if compiled.plan.arch == "sm80" else (6, 5)
    assert (families.count("cutlass2x_sm80"), families.count("cutlass3x_sm90")) == expected, \
        [k.name for k in compiled.plan.distinct_kernels]


@pytest.mark.parametrize("trial", range(2))
def test_cases_match_reference(suite, trial):
    model, compiled = suite
    inputs = suite_inputs(CASES, "cuda", seed=100 * (trial + 1))
    before = _fallback_calls(compiled)
    poison_allocator()
    with torch.no_grad():
        outs = compiled(*inputs)
    torch.cuda.synchronize()
    assert _fallback_calls(compiled) == before, "a region call fell back to PyTorch"
    failures = []
    for c, xs, out in zip(CASES, model.split(inputs), outs):
        ref = reference(c, *xs)
        err = rel_err_nan(out, ref)
        if out.shape != ref.shape or out.dtype != DTYPES[c["dtype"]] or not err <= TOL[out.dtype]:
            failures.append(f"{case_id(c)}: {tuple(out.shape)} {out.dtype} rel err {err:.3e}")
    assert not failures, "\n".join(failures)


def test_dynamic_sequence_length():
    """The "s": "a" conformance entries: s exported as a dynamic dim, run at several values."""
    cases = [c for c in conformance_cases() if c["dynamic"]]
    assert {c["dtype"] for c in cases} == {"fp16", "fp32"}
    model = SuiteModel(cases)
    s = torch.export.Dim("s", min=2, max=128)
    spec = tuple(({1: s}, None, None) for _ in cases)
    compiled = co.compile(model, suite_inputs(cases, "cuda"),
                          dynamic_shapes=(tuple(x for t in spec for x in t),))
    assert len(compiled.plan.regions) == len(cases)
    assert all(r.problem.seq_q is None for r in compiled.plan.regions)
    for n in (10, 17, 33, 50):
        inputs = tuple(x for i, c in enumerate(cases) for x in case_inputs(c, "cuda", seed=n + i, s=n))
        poison_allocator()
        with torch.no_grad():
            outs = compiled(*inputs)
        for c, xs, out in zip(cases, model.split(inputs), outs):
            assert out.shape == (c["b"], n, c["n"], c["h_v"])
            assert rel_err_nan(out, reference(c, *xs)) <= TOL[out.dtype], (case_id(c), n)
    assert _fallback_calls(compiled) == 0


class _Masked(torch.nn.Module):
    def forward(self, q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def _masked_reference(q, k, v, m):
    """SDPA with a boolean mask in float64; rows without a key are 0 (PyTorch's rule)."""
    q, k, v = q.double(), k.double(), v.double()
    logits = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~m, float("-inf"))
    return torch.nan_to_num(torch.softmax(logits, dim=-1), nan=0.0) @ v


def test_cuda_graph_and_misaligned_fallback():
    """A boolean mask (0/-inf bias padded for the kernel, rows without a key zeroed)
    replays in a CUDA graph; a misaligned q is copied to aligned storage and matches."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, s, 64, device="cuda", dtype=torch.float16) for s in (24, 20, 20))
    m = torch.rand(2, 1, 1, 20, device="cuda") > 0.3
    m[0] = False                                  # batch 0: no key at all
    m[1, ..., 0] = True
    # eager glue: the region module itself must see the misaligned q (Inductor's
    # graph may hand the op an aligned copy)
    compiled = co.compile(_Masked(), (q, k, v, m), glue="eager")
    (mod,) = _regions(compiled)
    with torch.no_grad():
        compiled(q, k, v, m)                      # warm up (workspace, smem attribute)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = compiled(q, k, v, m)
        q.copy_(torch.randn_like(q))
        g.replay()
        torch.cuda.synchronize()
    assert mod.fallback_calls == 0
    assert torch.all(out[0] == 0) and rel_err(out, _masked_reference(q, k, v, m)) <= TOL[torch.float16]
    m[0, ..., 0] = True                           # every row sees a key: PyTorch agrees on any backend
    flat = torch.randn(q.numel() + 1, device="cuda", dtype=torch.float16)
    qm = flat[1:].view_as(q)                      # 2-byte offset: not 16-byte aligned
    qm.copy_(q)
    with torch.no_grad():
        copies = mod.copies
        compiled(q, k, v, m)
        per_call = mod.copies - copies            # the boolean mask's bias, every call
        copies = mod.copies
        out = compiled(qm, k, v, m)
    # the misaligned q is copied and the kernel runs: PyTorch 2.11's own SDPA is wrong
    # on this call (relative error 1.06 on an H200), so falling back would be too
    assert mod.fallback_calls == 0 and mod.copies == copies + per_call + 1
    assert rel_err(out, _masked_reference(q, k, v, m)) <= TOL[torch.float16]


def test_gpt2_causal_attention_offloaded():
    """GPT-2 (sdpa, small config, dynamic batch): its explicit causal mask folds into
    the kernel's causal mode (checked once per batch size); the model matches PyTorch."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=256, n_layer=2, n_head=4, use_cache=False,
                                  attn_implementation="sdpa")

    class Wrap(torch.nn.Module):
        def __init__(self, hf):
            super().__init__()
            self.hf = hf

        def forward(self, ids):
            return self.hf(input_ids=ids).last_hidden_state
    hf = transformers.GPT2Model(cfg).eval()
    ref_model = Wrap(copy.deepcopy(hf)).cuda()             # fp32 reference
    ids = torch.randint(0, cfg.vocab_size, (4, 64), device="cuda")
    compiled = co.compile(Wrap(hf.half().cuda()), (ids,), dynamic_batch=True)
    att = [r for r in compiled.plan.regions if r.form == "sdpa"]
    assert len(att) == 2 and {r.problem.causal for r in att} == {"top_left"}
    assert all(r.mask_check for r in att)
    with torch.no_grad():
        for b in (4, 3, 4):
            x = torch.randint(0, cfg.vocab_size, (b, 64), device="cuda")
            assert rel_err(compiled(x), ref_model(x)) <= 2e-2, b
    assert _fallback_calls(compiled) == 0
