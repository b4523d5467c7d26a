"""Group norm regions (no nvcc, no GPU): which group_norm forms are offloaded (with
the SiLU after them, the graph's eps, affine or not), which stay in PyTorch with
a reason; the kernel chosen, the region module's NHWC mapping (CPU tensors, no
launch), the emitted source, the ABI mirror, launchers, shards and report."""
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cutlass_offload.build.shards import estimate, plan_shards
from cutlass_offload.capture import capture
from cutlass_offload.emit import TEMPLATES, emit_kernel, emit_launchers
from cutlass_offload.ir import GroupNormKernel, GroupNormProblem, GroupNormRegion
from cutlass_offload.partition import partition
from cutlass_offload.report import Report
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.runtime.group_norm_region import GroupNormRegionModule
from cutlass_offload.runtime.library import CoGroupNormArgs
from cutlass_offload.select import select

H = torch.float16
CL = torch.channels_last


class Fn(nn.Module):
    def __init__(self, fn, **params):
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            self.register_parameter(k, nn.Parameter(v, requires_grad=False))

    def forward(self, *xs):
        return self.fn(self, *xs)


class GnSilu(nn.Module):
    """diffusers' ResnetBlock2D start: GroupNorm -> SiLU (-> conv)."""

    def __init__(self, c=64, groups=32, eps=1e-5, affine=True, conv=False):
        super().__init__()
        self.norm = nn.GroupNorm(groups, c, eps=eps, affine=affine)
        self.conv = nn.Conv2d(c, c, 3, padding=1) if conv else None

    def forward(self, x):
        y = F.silu(self.norm(x))
        return self.conv(y) if self.conv is not None else y


def x_(n=2, c=64, h=8, w=8, dtype=H):
    return torch.randn(n, c, h, w, dtype=dtype).contiguous(memory_format=CL)


def parts(model, *inputs, arch="sm80", **kw):
    cap = capture(model, inputs, **kw)
    part = partition(cap.graph_module)
    return cap, part, select(part, arch)


def only_region(part) -> GroupNormRegion:
    assert not part.fallbacks, part.fallbacks
    (r,) = part.regions
    assert isinstance(r, GroupNormRegion)
    return r


# ----------------------------------------------------------------- partition

def test_group_norm_then_silu_is_one_region():
    _, part, plan = parts(GnSilu().half(), x_())
    r = only_region(part)
    p = r.problem
    assert r.form == "group_norm" and r.nodes == ("group_norm", "silu") and r.output == "silu"
    assert (p.dtype, p.c, p.h, p.w, p.groups, p.eps) == ("f16", 64, 8, 8, 32, 1e-5)
    assert p.silu and p.weight and p.bias and r.weight and r.bias and r.x == "x"
    assert (p.n, p.align, p.channels_per_group) == (2, 2, 2)
    (k,) = plan.kernels
    assert k.name == "nhwc_group_norm_f16_vec2_weight_bias_silu"
    assert (k.kind, k.args_type, k.config.family) == ("group_norm", "CoGroupNormArgs", "nhwc_group_norm")


def test_group_norm_alone_keeps_the_models_eps():
    m = nn.GroupNorm(32, 1280, eps=1e-6).to(torch.bfloat16)
    _, part, plan = parts(m, x_(c=1280, h=4, w=4, dtype=torch.bfloat16))
    r = only_region(part)
    assert r.nodes == ("group_norm",) and not r.problem.silu and r.problem.eps == 1e-6
    assert r.problem.align == 8                          # 40 channels per group: 16-byte vectors
    assert plan.kernels[0].name == "nhwc_group_norm_bf16_vec8_weight_bias"


def test_without_affine_and_default_eps_from_the_schema():
    _, part, plan = parts(Fn(lambda m, x: F.silu(torch.ops.aten.group_norm.default(x, 4))), x_(c=12))
    r = only_region(part)
    p = r.problem
    assert not p.weight and not p.bias and r.weight is None and r.bias is None
    assert p.eps == 1e-5 and p.silu and p.align == 1
    assert plan.kernels[0].name == "nhwc_group_norm_f16_vec1_noaffine_silu"


def test_affine_false_module():
    _, part, plan = parts(GnSilu(affine=False, eps=3e-6).float(), x_(dtype=torch.float32))
    r = only_region(part)
    assert not r.problem.weight and r.problem.eps == 3e-6 and r.problem.dtype == "f32"
    assert plan.kernels[0].name == "nhwc_group_norm_f32_vec2_noaffine_silu"


def test_weight_only_and_bias_only():
    w, b = torch.randn(16, dtype=H), torch.randn(16, dtype=H)
    _, part, plan = parts(Fn(lambda m, x: F.group_norm(x, 2, m.w, None, 1e-5), w=w), x_(c=16))
    assert plan.kernels[0].name == "nhwc_group_norm_f16_vec8_weight"
    _, part, plan = parts(Fn(lambda m, x: F.group_norm(x, 2, None, m.b, 1e-5), b=b), x_(c=16))
    r = only_region(part)
    assert r.weight is None and r.bias == "b"
    assert plan.kernels[0].name == "nhwc_group_norm_f16_vec8_bias"


def test_groups_not_dividing_c_stays_in_pytorch():
    """PyTorch refuses such a group_norm while exporting, so the captured graph's
    num_groups is changed afterwards."""
    cap = capture(GnSilu(c=12, groups=3).half(), (x_(c=12),))
    (gn,) = [n for n in cap.graph_module.graph.nodes if n.target is torch.ops.aten.group_norm.default]
    gn.args = (gn.args[0], 5) + tuple(gn.args[2:])
    part = partition(cap.graph_module)
    assert not part.regions
    (f,) = part.fallbacks
    assert f.op == "group_norm" and "not a multiple of num_groups=5" in f.reason


def test_3d_input_is_a_region_over_a_height_of_1_and_5d_stays_in_pytorch():
    # (N, C, L) is lifted to (N, C, 1, L) (partition/lift_1d.py); other ranks stay
    _, part, _ = parts(nn.GroupNorm(4, 16).half(), torch.randn(2, 16, 10, dtype=H))
    (r,) = part.regions
    assert (r.problem.h, r.problem.w) == (1, 10) and not part.fallbacks
    _, part, _ = parts(nn.GroupNorm(4, 16).half(), torch.randn(2, 16, 3, 4, 5, dtype=H))
    assert not part.regions
    (f,) = part.fallbacks
    assert f.op == "group_norm" and "5-D input" in f.reason


def test_dynamic_spatial_size_falls_back_dynamic_batch_does_not():
    m = GnSilu(c=16, groups=4).half()
    _, part, _ = parts(m, x_(n=3, c=16, h=12), dynamic_shapes=({0: torch.export.Dim.AUTO,
                                                               2: torch.export.Dim.AUTO},))
    assert not part.regions and "dynamic C, H or W" in part.fallbacks[0].reason
    _, part, _ = parts(m, x_(n=3, c=16), dynamic_batch=True)
    r = only_region(part)
    assert r.problem.n is None and r.problem.n_hint == 3


def test_mixed_dtype_weight_stays_in_pytorch():
    _, part, _ = parts(Fn(lambda m, x: F.group_norm(x, 4, m.w, None, 1e-5), w=torch.randn(16)), x_(c=16))
    assert not part.regions and "differs from the input" in part.fallbacks[0].reason


def test_silu_is_not_fused_when_the_norm_is_used_twice():
    def f(m, x):
        y = F.group_norm(x, 4, None, None, 1e-5)
        return F.silu(y), y * 2
    _, part, plan = parts(Fn(f), x_(c=16))
    r = only_region(part)
    assert r.nodes == ("group_norm",) and not r.problem.silu
    assert any("not fused" in n for n in r.notes)


def test_group_norm_between_convs():
    """A conv region, then group_norm + silu, then the next conv region: three regions."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.gn = nn.Conv2d(32, 64, 3, padding=1), nn.GroupNorm(32, 64)
            self.conv2 = nn.Conv2d(64, 64, 3, padding=1)

        def forward(self, x):
            return self.conv2(F.silu(self.gn(self.conv1(x))))
    _, part, plan = parts(Block().half().to(memory_format=CL), x_(c=32))
    assert [type(r).__name__ for r in part.regions] == ["ConvRegion", "GroupNormRegion", "ConvRegion"]
    conv1, gn, conv2 = part.regions
    assert gn.x == conv1.output and conv2.x == gn.output and gn.problem.silu
    report = Report.from_plan(plan)
    assert "group_norm:silu x1" in report.format()
    (entry,) = [e for e in report.regions if e["form"] == "group_norm"]
    assert entry["group_norm"] == {"n_hint": 2, "c": 64, "h": 8, "w": 8, "groups": 32, "eps": 1e-5,
                                   "weight": True, "bias": True, "silu": True}


def test_problem_validation():
    with pytest.raises(ValueError, match="multiple of groups"):
        GroupNormProblem("f16", c=12, h=1, w=1, groups=5, eps=1e-5, align=1)
    with pytest.raises(ValueError, match="align"):
        GroupNormProblem("f16", c=12, h=1, w=1, groups=3, eps=1e-5, align=8)
    with pytest.raises(ValueError, match="vector width"):
        GroupNormKernel("sm80", "f32", 8, True, True, False)


# ----------------------------------------------------------------- region module

def gn_module(model, *inputs):
    cap = capture(model, inputs)
    plan = select(partition(cap.graph_module), "sm80")
    gm = offload(cap.graph_module, plan, library_path=None)
    (mod,) = [m for m in gm.modules() if isinstance(m, GroupNormRegionModule)]
    return mod


def test_fallback_subgraph_computes_the_original():
    m = GnSilu(c=16, groups=4).half()
    with torch.no_grad():
        m.norm.weight.normal_()
        m.norm.bias.normal_()
    mod = gn_module(m, x_(c=16))
    x = x_(n=3, c=16)
    assert torch.equal(mod.fallback(x, m.norm.weight.detach(), m.norm.bias.detach()), m(x))


def test_channels_last_input_maps_without_a_copy():
    m = GnSilu(c=64, groups=32, eps=1e-6).half()
    mod = gn_module(m, x_())
    w, b = m.norm.weight.detach(), m.norm.bias.detach()
    x = x_(n=3)                                            # another batch: sizes are per call
    out, args, keep = mod._map((x, w, b))
    assert out.shape == (3, 64, 8, 8) and out.dtype == H
    assert out.is_contiguous(memory_format=CL) and out.permute(0, 2, 3, 1).is_contiguous()
    assert args.input == x.data_ptr() and args.output == out.data_ptr()
    assert args.weight == w.data_ptr() and args.bias == b.data_ptr()
    assert (args.n, args.h, args.w, args.c, args.groups) == (3, 8, 8, 64, 32)
    assert abs(args.eps - 1e-6) < 1e-12 and mod._ws_key(args) == (3,)
    assert mod.layout_conversions == 0


def test_nchw_input_is_converted_and_counted():
    m = GnSilu(c=64, groups=32).half()
    mod = gn_module(m, x_())
    w, b = m.norm.weight.detach(), m.norm.bias.detach()
    x = torch.randn(2, 64, 8, 8, dtype=H)                  # NCHW-contiguous
    out, args, keep = mod._map((x, w, b))
    assert args.input != x.data_ptr() and args.input == keep[0].data_ptr()
    assert torch.equal(keep[0], x.permute(0, 2, 3, 1)) and keep[0].is_contiguous()
    assert mod.layout_conversions == 1 and out.is_contiguous(memory_format=CL)


def test_calls_that_do_not_fit_are_refused():
    m = GnSilu(c=64, groups=32).half()
    mod = gn_module(m, x_())
    w, b = m.norm.weight.detach(), m.norm.bias.detach()
    assert mod._map((x_().float(), w, b)) is None                       # dtype
    assert mod._map((x_(c=32), w, b)) is None                           # C
    assert mod._map((x_(h=4), w, b)) is None                            # H
    assert mod._map((x_(n=0), w, b)) is None                            # empty batch
    assert mod._map((torch.randn(2, 64, 8, dtype=H), w, b)) is None     # 3-D
    assert mod._map((x_(), w.float(), b)) is None                       # weight dtype
    buf = torch.empty(2 * 64 * 64 + 1, dtype=H)
    odd = buf[1:].view(2, 8, 8, 64).permute(0, 3, 1, 2)                 # channels_last, 2-byte offset
    assert mod._map((odd, w, b)) is None                                # vec 2: 4-byte alignment
    assert mod.layout_conversions == 0


# ----------------------------------------------------------------- emit, ABI, build plan

def test_emitted_source():
    src = emit_kernel(GroupNormKernel("sm80", "bf16", 4, True, False, True))
    assert src.args_type == "CoGroupNormArgs" and src.name == "nhwc_group_norm_bf16_vec4_weight_silu"
    assert f"namespace {src.name} {{" in src.code
    assert "int run(const CoGroupNormArgs& args, cudaStream_t stream)" in src.code
    assert "int64_t workspace_size(const CoGroupNormArgs& args)" in src.code
    assert "run<cutlass::bfloat16_t, 4, true, false, true>" in src.code
    assert "1e-5" not in src.code and "1e-05" not in src.code and "a.eps" in src.code
    assert "malloc" not in src.code.lower() and "device_groupnorm" not in "".join(src.includes)
    # every __global__ is a template: two shards of one library must link
    for m in re.finditer(r"__global__", src.code):
        before = src.code[max(0, m.start() - 200):m.start()]
        assert "template <" in before.splitlines()[-1] or "template <" in before.splitlines()[-2]


def test_args_mirror_matches_the_prelude():
    text = (TEMPLATES / "prelude.h").read_text()
    body = re.search(r"struct CoGroupNormArgs \{(.*?)\};", text, re.S).group(1)
    names = [n for line in body.split(";") if line.strip()
             for n in re.sub(r"^\s*(const\s+)?\w+\*?\s*", "", line.strip()).replace(" ", "").split(",")]
    assert names == [f for f, _ in CoGroupNormArgs._fields_]


def test_launchers_and_shards():
    m = nn.Sequential(GnSilu(c=64), nn.GroupNorm(8, 64)).half()
    cap = capture(m, (x_(),))
    plan = select(partition(cap.graph_module), "sm90a")
    assert [type(r).__name__ for r in plan.regions] == ["GroupNormRegion", "GroupNormRegion"]
    tu = emit_launchers(plan)
    for r in plan.regions:
        assert f'extern "C" int co_{r.name}(const CoGroupNormArgs* args' in tu.text
    shards = plan_shards(list(plan.distinct_kernels), 2)
    assert sorted(k.name for s in shards for k in s) == sorted(k.name for k in plan.distinct_kernels)
    assert estimate(list(plan.distinct_kernels)) > 0
