"""GPU: group_norm (+ SiLU) regions run offloaded on NHWC (channels_last) inputs
and match a float64 PyTorch reference; their outputs are channels_last, so the
conv after them needs no layout conversion.

One library holds every case's kernel (one build, dynamic batch): the suite
model takes one input per case and returns one output per case. Cases: Stable
Diffusion's shapes (batch 2, 32 groups: 320 x 64x64 with SiLU, 1280 x 8x8,
640 x 32x32 without SiLU, bf16 960 x 32x32), an odd one (C = 12, 3 groups, 7x5,
fp32), no affine, a tiny variance with eps 1e-6 (eps must be the graph's), a mean
500 standard deviations away from 0 (E[x^2] - E[x]^2 would lose it), and
GroupNorm -> SiLU -> conv as in diffusers' ResnetBlock2D. Both launch plans of
emit/group_norm.py run: three launches (statistics over pixel tiles, finalize,
apply) for the 64x64 and 32x32 cases with 640 / 960 channels, the one-launch
fused kernel for 8x8 / 16x16, the odd and the small cases.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cutlass_offload as co
from cutlass_offload.ir import GroupNormRegion
from helpers import TOLERANCE, poison_allocator, rel_err

pytestmark = pytest.mark.gpu
CL = torch.channels_last


class GnSilu(nn.Module):
    def __init__(self, c, groups, eps=1e-5, silu=True, affine=True, conv=False):
        super().__init__()
        self.norm = nn.GroupNorm(groups, c, eps=eps, affine=affine)
        self.silu = silu
        self.conv = nn.Conv2d(c, c, 3, padding=1) if conv else None

    def forward(self, x):
        y = self.norm(x)
        if self.silu:
            y = F.silu(y)
        return self.conv(y) if self.conv is not None else y


# (id, module factory, input shape, dtype, input scale, input offset)
CASES = [
    ("sd_320x64x64_silu", lambda: GnSilu(320, 32), (2, 320, 64, 64), torch.float16, 1.0, 0.0),
    ("sd_1280x8x8_silu", lambda: GnSilu(1280, 32), (2, 1280, 8, 8), torch.float16, 1.0, 0.0),
    ("sd_640x32x32_no_silu", lambda: GnSilu(640, 32, eps=1e-6, silu=False), (2, 640, 32, 32),
     torch.float16, 1.0, 0.0),
    ("sd_960x32x32_silu_bf16", lambda: GnSilu(960, 32), (2, 960, 32, 32), torch.bfloat16, 1.0, 0.0),
    ("odd_12c_3g_7x5_f32", lambda: GnSilu(12, 3), (2, 12, 7, 5), torch.float32, 1.0, 0.0),
    ("noaffine_64c_8g_f16", lambda: GnSilu(64, 8, affine=False), (2, 64, 9, 9), torch.float16, 1.0, 0.0),
    ("tiny_var_eps1e-6", lambda: GnSilu(64, 32, eps=1e-6, silu=False), (2, 64, 16, 16), torch.float16,
     1e-3, 0.0),
    ("mean_500_sigma", lambda: GnSilu(320, 32, silu=False), (2, 320, 64, 64), torch.float32, 0.1, 50.0),
    ("mean_500_sigma_fused", lambda: GnSilu(1280, 32, silu=False), (2, 1280, 8, 8), torch.float32,
     0.1, 50.0),
    ("gn_silu_conv", lambda: GnSilu(320, 32, conv=True), (2, 320, 16, 16), torch.float16, 1.0, 0.0),
]
EPS_CASE = 6


class Suite(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList()
        for _, make, _, dtype, _, _ in CASES:
            m = make()
            with torch.no_grad():             # weight ~ N(1, 0.5), bias ~ N(0, 0.5)
                for pname, prm in m.norm.named_parameters():
                    prm.normal_(1.0 if pname == "weight" else 0.0, 0.5)
            self.blocks.append(m.to(dtype).to(memory_format=CL))

    def forward(self, *xs):
        return tuple(m(x) for m, x in zip(self.blocks, xs))


def inputs(seed, batch=None, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _, _, shape, dtype, scale, offset in CASES:
        shape = (batch or shape[0],) + shape[1:]
        x = torch.randn(shape, generator=g, dtype=torch.float64) * scale + offset
        out.append(x.to(dtype).to(device).contiguous(memory_format=CL))
    return tuple(out)


@pytest.fixture(scope="module")
def suite():
    model = Suite().cuda().eval()
    compiled = co.compile(model, inputs(0), dynamic_batch=True)
    return model, compiled


def _reference(model, xs):
    ref = copy.deepcopy(model).double()
    with torch.no_grad():
        return ref(*(x.double() for x in xs))


def _check(model, compiled, xs):
    before = sum(m.fallback_calls for m in compiled.region_modules())
    poison_allocator()
    with torch.no_grad():
        outs = compiled(*xs)
    torch.cuda.synchronize()
    assert sum(m.fallback_calls for m in compiled.region_modules()) == before, \
        "a region fell back to PyTorch instead of running its kernel"
    refs = _reference(model, xs)
    failures = []
    for (name, _, _, dtype, _, _), x, out, ref in zip(CASES, xs, outs, refs):
        assert out.shape == x.shape and out.dtype == dtype, name
        assert out.is_contiguous(memory_format=CL), f"{name}: output not channels_last"
        assert not out.isnan().any(), f"{name}: unwritten (NaN) output"
        err = rel_err(out, ref)
        if not err < TOLERANCE[dtype]:
            failures.append(f"{name}: relative error {err:.2e}")
    assert not failures, failures
    return outs


def test_every_case_offloaded(suite):
    _, compiled = suite
    plan = compiled.plan
    assert not plan.fallbacks, compiled.report.format()
    gns = [r for r in plan.regions if isinstance(r, GroupNormRegion)]
    assert len(gns) == len(CASES) and len(plan.regions) == len(CASES) + 1     # + the conv
    assert [r.problem.silu for r in gns] == [True, True, False, True, True, True, False, False, False, True]
    assert gns[EPS_CASE].problem.eps == 1e-6
    names = {k.name for k in plan.kernels}
    assert {"nhwc_group_norm_f16_vec2_weight_bias_silu", "nhwc_group_norm_f16_vec8_weight_bias_silu",
            "nhwc_group_norm_f16_vec4_weight_bias", "nhwc_group_norm_bf16_vec2_weight_bias_silu",
            "nhwc_group_norm_f32_vec4_weight_bias_silu", "nhwc_group_norm_f16_vec8_noaffine_silu"} <= names


@pytest.mark.parametrize("trial", range(2))
def test_cases_match_float64_reference(suite, trial):
    model, compiled = suite
    _check(model, compiled, inputs(trial + 1))                # fresh data, not the example inputs


@pytest.mark.parametrize("batch", [1, 5])
def test_other_batch_sizes(suite, batch):
    model, compiled = suite
    _check(model, compiled, inputs(20 + batch, batch=batch))


def test_no_layout_conversions_with_channels_last_inputs(suite):
    """GroupNorm -> SiLU -> conv: the norm's channels_last output goes straight into
    the conv; an NCHW input to a norm is converted once, counted, and still right."""
    model, compiled = suite
    xs = inputs(3)
    before = compiled.layout_conversions()
    with torch.no_grad():
        compiled(*xs)
    assert compiled.layout_conversions() == before
    xs = list(inputs(4))
    xs[0] = xs[0].contiguous()                               # NCHW
    assert not xs[0].is_contiguous(memory_format=CL)
    with torch.no_grad():
        outs = compiled(*xs)
    assert compiled.layout_conversions() == before + 1
    assert outs[0].is_contiguous(memory_format=CL)
    assert rel_err(outs[0], _reference(model, xs)[0]) < TOLERANCE[torch.float16]


def test_eps_is_the_models(suite):
    """eps 1e-5 instead of the graph's 1e-6 on inputs of variance 1e-6 would scale
    the output by ~0.3: the kernel really uses the graph's eps."""
    model, compiled = suite
    xs = inputs(5)
    with torch.no_grad():
        out = compiled(*xs)[EPS_CASE]
        m = model.blocks[EPS_CASE].norm
        wrong = F.group_norm(xs[EPS_CASE].double(), 32, m.weight.double(), m.bias.double(), 1e-5)
    assert rel_err(out, wrong) > 0.1


def test_misaligned_input_runs_pytorch(suite):
    """The region module falls back for an input its vectors cannot read. With eager
    glue it sees the input as given; Inductor's glue copies a misaligned graph input to
    aligned memory first (torch.compile's copy_misaligned_inputs), so there the region
    runs and only the result is checked."""
    model, compiled = suite
    eager = co.compile(model, inputs(0), dynamic_batch=True, glue="eager")   # kernels cached
    xs = list(inputs(7))
    x = xs[0]                                                # vec 2 (4-byte) kernel
    buf = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
    n, c, h, w = x.shape
    xs[0] = buf[1:].view(n, h, w, c).permute(0, 3, 1, 2).copy_(x)      # channels_last, 2-byte offset
    mod = [m for m in eager.region_modules() if isinstance(m.region, GroupNormRegion)][0]
    before = mod.fallback_calls
    with torch.no_grad():
        outs, outs_inductor = eager(*xs), compiled(*xs)
    assert mod.fallback_calls == before + 1
    ref = _reference(model, xs)[0]
    assert rel_err(outs[0], ref) < TOLERANCE[torch.float16]
    assert rel_err(outs_inductor[0], ref) < TOLERANCE[torch.float16]


def test_cuda_graph_capture(suite):
    model, compiled = suite
    static_in = inputs(11)
    with torch.no_grad():
        compiled(*static_in)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            compiled(*static_in)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = compiled(*static_in)
    for dst, src in zip(static_in, inputs(12)):
        dst.copy_(src)
    g.replay()
    torch.cuda.synchronize()
    refs = _reference(model, static_in)
    for (name, _, _, dtype, _, _), out, ref in zip(CASES, static_out, refs):
        assert rel_err(out, ref) < TOLERANCE[dtype], name
