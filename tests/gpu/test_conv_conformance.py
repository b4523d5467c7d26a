"""GPU: conv2d regions (conformance cases and extras) run offloaded and match PyTorch.

Conformance cases draw data from {-1, 0}: every product and partial sum is a small
integer, exact in fp16 and fp32, so the offloaded result must equal the float32
reference rounded to fp16 exactly, except after a transcendental activation
(silu), which is computed in fp32 and rounded once: norm-wise relative error
within one fp16 rounding (2^-11). The extras use normal data and the dtype
tolerance of tests/helpers.py. One library holds every case's kernel.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cutlass_offload as co
from conv_cases import SuiteModel, case_forward, case_id, conformance_cases, extra_cases, suite_inputs
from helpers import TOLERANCE, poison_allocator, rel_err

pytestmark = pytest.mark.gpu
CASES = conformance_cases() + extra_cases()
ONE_ROUNDING = 2.0 ** -11


@pytest.fixture(scope="module")
def suite():
    model = SuiteModel(CASES, torch.float16)
    compiled = co.compile(model, suite_inputs(CASES, torch.float16))
    return model.cuda(), compiled.to("cuda")


def test_every_case_offloaded(suite):
    _, compiled = suite
    assert len(compiled.plan.regions) == len(CASES), compiled.report.format()
    assert not compiled.plan.fallbacks


@pytest.mark.parametrize("trial", range(2))
def test_cases_match_reference(suite, trial):
    model, compiled = suite
    inputs = suite_inputs(CASES, torch.float16, "cuda", seed=trial + 1)
    before = sum(m.fallback_calls for m in compiled.region_modules())
    poison_allocator()
    with torch.no_grad():
        outs = compiled(*inputs)
    torch.cuda.synchronize()
    assert sum(m.fallback_calls for m in compiled.region_modules()) == before
    assert compiled.layout_conversions() == 0     # channels_last inputs, prepacked weights
    failures = []
    for i, (c, x, out) in enumerate(zip(CASES, inputs, outs)):
        b = model.biases[i].float() if c["bias"] else None
        r = model.channel[i].float() if c["residual"].startswith("channel") else None
        ref = case_forward(c, x.float(), model.weights[i].float(), b, r)
        assert out.shape == ref.shape and out.is_contiguous(memory_format=torch.channels_last)
        if c["data"] == "int" and c["act"] != "silu":
            ok = torch.equal(out, ref.half())
            err = rel_err(out, ref)
        else:
            err = rel_err(out, ref)
            ok = err <= (ONE_ROUNDING if c["data"] == "int" else TOLERANCE[torch.float16])
        if not ok:
            failures.append(f"{case_id(c)}: rel err {err:.3e}")
    assert not failures, "\n".join(failures)


def test_kernel_sharing_is_exact():
    """Two chained convs share one kernel; the result equals the reference exactly."""
    c = conformance_sharing()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False),
                      nn.Conv2d(8, 8, 3, padding=1, bias=False)).half().cuda()
    for conv in m:
        conv.weight.data = torch.randint(-1, 1, conv.weight.shape, device="cuda").half()
    x = torch.randint(-1, 1, c["data_nchw"], device="cuda").half().contiguous(
        memory_format=torch.channels_last)
    compiled = co.compile(m, (x,))
    assert len(compiled.plan.regions) == 2 and len(compiled.plan.distinct_kernels) == 1
    poison_allocator()
    with torch.no_grad():
        out = compiled(x)
        # fp16 intermediate (exact: small integers), fp32 accumulation, one rounding
        ref = F.conv2d(F.conv2d(x.float(), m[0].weight.float(), padding=1).half().float(),
                       m[1].weight.float(), padding=1).half()
    assert torch.equal(out, ref)


def conformance_sharing():
    from conv_cases import SUITE
    return SUITE["conv2d_kernel_sharing_exact"][0]


def test_nchw_input_is_converted_once_and_counted():
    m = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1)).half().cuda()
    x = torch.randn(2, 16, 16, 16, device="cuda", dtype=torch.float16)     # NCHW-contiguous
    # eager glue: the ReLU keeps the first region's channels_last output. (Inductor
    # glue hands each region op its inputs with the strides they were traced with,
    # tag needs_exact_strides: an NCHW-traced model converts before every conv.)
    compiled = co.compile(m, (x,), glue="eager")
    with torch.no_grad():
        out = compiled(x)
        ref = copy.deepcopy(m).float()(x.float())
    assert rel_err(out, ref) <= TOLERANCE[torch.float16]
    assert compiled.layout_conversions() == 1      # only the model input


def test_dynamic_batch_and_bf16():
    m = nn.Sequential(nn.Conv2d(32, 64, 3, padding=1), nn.SiLU()).to(torch.bfloat16).cuda()
    m = m.to(memory_format=torch.channels_last)
    x = torch.randn(3, 32, 12, 12, device="cuda", dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    compiled = co.compile(m, (x,), dynamic_batch=True)
    assert len(compiled.plan.regions) == 1
    ref_model = copy.deepcopy(m).float()
    for n in (1, 5, 17):
        xn = torch.randn(n, 32, 12, 12, device="cuda", dtype=torch.bfloat16).contiguous(
            memory_format=torch.channels_last)
        poison_allocator()
        with torch.no_grad():
            out = compiled(xn)
            ref = ref_model(xn.float())
        assert rel_err(out, ref) <= TOLERANCE[torch.bfloat16], n
    assert sum(mod.fallback_calls for mod in compiled.region_modules()) == 0


def test_misaligned_input_falls_back_correctly():
    m = nn.Conv2d(16, 16, 3, padding=1).half().cuda().to(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 8, 8, device="cuda", dtype=torch.float16).contiguous(
        memory_format=torch.channels_last)
    # eager glue: the region module sees the caller's pointer (Inductor glue hands the
    # region op a copy with the traced strides, aligned: nothing would fall back)
    compiled = co.compile(m, (x,), glue="eager")
    flat = torch.randn(2 * 16 * 8 * 8 + 1, device="cuda", dtype=torch.float16)
    xm = flat[1:].view(2, 8, 8, 16).permute(0, 3, 1, 2)       # channels_last, 2-byte offset
    with torch.no_grad():
        out = compiled(xm)
        ref = copy.deepcopy(m).float()(xm.float())
    assert rel_err(out, ref) <= TOLERANCE[torch.float16]
    (mod,) = compiled.region_modules()
    assert mod.fallback_calls == 1


class _FewChannels(nn.Module):
    """ResNet-50's stem (C=3, 7x7 stride 2, bias + relu; f16) and the SD UNet's
    conv_in (C=4, 3x3, bias; bf16): C not a multiple of 8."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 7, stride=2, padding=3).half()
        self.conv_in = nn.Conv2d(4, 320, 3, padding=1).to(torch.bfloat16)

    def forward(self, x, z):
        return torch.relu(self.stem(x)), self.conv_in(z)


def _few_channel_inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 64, 64, generator=gen).half()
    z = torch.randn(2, 4, 32, 32, generator=gen).to(torch.bfloat16)
    return tuple(t.cuda().contiguous(memory_format=torch.channels_last) for t in (x, z))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm_90 GPU (the im2col lowering is sm90a's)")
def test_few_channel_convs_run_the_im2col_gemm():
    """C = 3 and C = 4 are lowered onto the sm90 GEMM through an explicit im2col
    (families/conv_gemm_sm90.py), unpadded; the result is the conv's (float32
    reference), on fresh inputs, nothing copied on the Python side."""
    torch.manual_seed(0)
    m = _FewChannels().cuda().to(memory_format=torch.channels_last)
    compiled = co.compile(m, _few_channel_inputs(0), glue="eager")
    assert [r.problem.pad_c for r in compiled.plan.regions] == [0, 0], compiled.report.format()
    assert [k.iterator for k in compiled.plan.kernels] == ["im2col", "im2col"]
    assert {k.config.family for k in compiled.plan.kernels} == {"cutlass3x_sm90"}
    ref_model = copy.deepcopy(m).float()
    for trial in (1, 2):
        x, z = _few_channel_inputs(trial)
        poison_allocator()
        with torch.no_grad():
            y_stem, y_in = compiled(x, z)
            r_stem, r_in = ref_model(x.float(), z.float())
        torch.cuda.synchronize()
        assert rel_err(y_stem, r_stem) <= TOLERANCE[torch.float16]
        assert rel_err(y_in, r_in) <= TOLERANCE[torch.bfloat16]
        assert y_stem.is_contiguous(memory_format=torch.channels_last)
    assert sum(mod.fallback_calls for mod in compiled.region_modules()) == 0
    assert compiled.layout_conversions() == 0 and compiled.channel_pad_copies() == 0
