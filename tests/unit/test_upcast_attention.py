"""GPT-J's attention keeps its scores in fp32 (``query.to(float32) @ key.to(float32)^T``,
the softmax in fp32, cast back before ``@ v``): one attention region on the 16-bit q and
k (the kernel's q @ k^T sums exact products in fp32, as the fp32 matmul does); its
mapped call, run as the kernel reads its arguments, matches a float64 reference."""
import math

import pytest
import torch

from attention_cases import rel_err_nan
from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.partition import partition
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.select import select
from helpers import Fn
from test_attention_partition import run_emulated

H = torch.float16


def gptj(q, k, v):
    """transformers' GPT-J eager_attention_forward with its causal mask as a bias."""
    scaling = 1 / math.sqrt(q.shape[-1])
    w = torch.matmul(q.to(torch.float32), k.to(torch.float32).transpose(2, 3)) * scaling
    L = q.shape[-2]
    keep = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    w = w + torch.zeros(L, L, device=q.device).masked_fill(~keep, torch.finfo(torch.float32).min)
    w = torch.softmax(w, dim=-1).to(v.dtype)
    return torch.matmul(w, v)


def _plan(fn, *xs):
    cap = capture(Fn(fn), xs)
    return cap, select(partition(cap.graph_module, CompileOptions(arch="sm90a")), "sm90a")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gptj_attention_is_one_region_on_the_16_bit_inputs(monkeypatch, dtype):
    xs = tuple(torch.randn(2, 4, 48, 64).to(dtype) for _ in range(3))
    cap, plan = _plan(gptj, *xs)
    assert not plan.fallbacks, plan.fallbacks
    (r,) = plan.regions
    assert r.problem.dtype == {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    assert r.problem.causal == "top_left" and r.problem.scale == pytest.approx(0.125)
    assert (r.q, r.k) == ("xs_0", "xs_1")           # the inputs: the casts joined the region
    gm = offload(cap.graph_module, plan, library_path=None)
    log = run_emulated(monkeypatch, gm)
    ys = tuple(torch.randn(2, 4, 48, 64).to(dtype) for _ in range(3))
    with torch.no_grad():
        out = gm(*ys)
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert [ran for _, ran in log] == [True]
    ref = gptj(*(y.double() for y in ys)).double()
    assert rel_err_nan(out, ref) < 2e-2


def test_one_operand_upcast_stays_two_gemms_with_the_reason():
    def mixed(q, k, v):
        w = torch.matmul(q.to(torch.float32), k.transpose(2, 3).to(torch.float32).contiguous() * 1.0)
        return torch.matmul(torch.softmax(w, dim=-1).to(v.dtype), v)
    xs = tuple(torch.randn(1, 2, 16, 64, dtype=H) for _ in range(3))
    _, plan = _plan(mixed, *xs)
    assert not any(r.name.endswith("attention_plain") for r in plan.regions)


def test_an_upcast_used_elsewhere_is_not_read_through():
    def shared(q, k, v):
        q32 = q.to(torch.float32)
        w = torch.matmul(q32, k.to(torch.float32).transpose(2, 3))
        return torch.matmul(torch.softmax(w, dim=-1).to(v.dtype), v), q32.sum()
    xs = tuple(torch.randn(1, 2, 16, 64, dtype=H) for _ in range(3))
    _, plan = _plan(shared, *xs)
    att = [r for r in plan.regions if "attention" in r.name]
    assert not att
