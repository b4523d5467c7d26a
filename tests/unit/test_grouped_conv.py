"""Grouped conv2d (no GPU, no nvcc): which grouped convs (channel groups, not
depthwise) become regions on CUTLASS 2.x's grouped fprop kernel
(families/grouped_conv.py) when CUTLASS_OFFLOAD_GROUPED_CONV=1, the group mode, tile
and C++ they get, and the reason each other one stays in PyTorch (all of them while
the switch is off). tests/build compiles the kernels, tests/gpu runs them."""
import pytest
import torch
import torch.nn as nn

from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.emit import emit_kernel
from cutlass_offload.families import grouped_conv, sm80
from cutlass_offload.ir import ConvKernel, ConvProblem, GemmEpilogue
from cutlass_offload.partition import partition
from cutlass_offload.select import select

H = torch.float16


class Grouped(nn.Module):
    def __init__(self, c=64, k=64, groups=4, r=3, act=True, residual=False, dtype=H):
        super().__init__()
        self.conv = nn.Conv2d(c, k, r, padding=r // 2, groups=groups).to(dtype)
        self.act, self.residual = act, residual

    def forward(self, x):
        y = self.conv(x)
        y = torch.relu(y) if self.act else y
        return y + x if self.residual else y


def plan_of(model, h=14, dtype=H):
    c = model.conv.in_channels
    x = torch.randn(2, c, h, h, dtype=dtype).contiguous(memory_format=torch.channels_last)
    options = CompileOptions()
    return select(partition(capture(model.eval(), (x,), dynamic_batch=True).graph_module, options),
                  "sm90a", options)


@pytest.fixture
def grouped_on(monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_GROUPED_CONV", "1")


def problem(c, k, groups, dtype="f16", h=14, n=8, epilogue=GemmEpilogue(bias=True)):
    c_g = c // groups
    align = max(a for a in (8, 4, 2, 1) if c_g % a == 0)
    return ConvProblem(c=c, k=k, h=h, w=h, r=3, s=3, dtype=dtype, align_a=align, align_b=align,
                       align_c=max(a for a in (8, 4, 2, 1) if k % a == 0), pad=(1, 1, 1, 1),
                       groups=groups, n_hint=n, epilogue=epilogue)


def test_switched_off_grouped_convs_stay_in_pytorch_saying_why(monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_GROUPED_CONV", "0")
    plan = plan_of(Grouped(c=128, k=128, groups=4))
    assert not plan.regions
    (fb,) = plan.fallbacks
    assert "grouped convolution (groups=4 with C=128, K=128" in fb.reason and "not depthwise" in fb.reason
    assert "CUTLASS_OFFLOAD_GROUPED_CONV=0" in fb.reason


def test_grouped_convs_are_on_by_default(monkeypatch):
    monkeypatch.delenv("CUTLASS_OFFLOAD_GROUPED_CONV", raising=False)
    plan = plan_of(Grouped(c=128, k=128, groups=4))
    assert not plan.fallbacks and plan.kernels[0].groups == 4


def test_grouped_convs_measured_slower_than_cudnn_stay_in_pytorch(grouped_on):
    """benchmarks/grouped_conv_latency.py's H200 run (session 32) listed ResNeXt-101's
    1024-channel 14x14 conv at batch 32 (ours 35 us, cuDNN's conv alone 28 us) in the
    measured-faster list; the 7x7 one (ours faster) keeps our kernel."""
    def plan_at(h):
        m = nn.Conv2d(1024, 1024, 3, padding=1, groups=32).half().eval()
        x = torch.randn(32, 1024, h, h, dtype=H).contiguous(memory_format=torch.channels_last)
        options = CompileOptions()
        return select(partition(capture(m, (x,), dynamic_batch=True).graph_module, options),
                      "sm90a", options)
    slow, fast = plan_at(14), plan_at(7)
    assert not slow.regions and "cudnn conv alone" in slow.fallbacks[0].reason, slow.fallbacks
    assert fast.kernels and fast.kernels[0].groups == 32 and not fast.fallbacks


def test_grouped_conv_becomes_a_region_with_bias_and_activation(grouped_on):
    plan = plan_of(Grouped(c=128, k=128, groups=4))
    assert not plan.fallbacks
    (r,), (k,) = plan.regions, plan.kernels
    assert r.problem.grouped and not r.problem.depthwise and r.problem.groups == 4
    assert isinstance(k, ConvKernel) and k.config.family == "cutlass2x_sm80"
    assert (k.groups, k.group_mode, k.iterator) == (4, "single", "optimized")
    assert k.epilogue.tag == "bias_relu" and "_g4s_" in k.name
    # a group's 32 channels are what one access reads: alignment 8 from C / groups
    assert (k.align_a, k.align_b) == (8, 8)


def test_a_residual_add_stays_in_the_glue(grouped_on):
    """There is no grouped variant of CUTLASS's fused-epilogue conv."""
    plan = plan_of(Grouped(c=64, k=64, groups=2, act=False, residual=True))
    (r,), (k,) = plan.regions, plan.kernels
    assert k.epilogue.residual == "none" and k.groups == 2
    assert any("residual epilogue" in n for n in r.notes), r.notes


@pytest.mark.parametrize("c, k, groups, mode, iterator, tile_n", [
    (128, 256, 4, "single", "optimized", None),   # C_g 32: whole K tiles
    (96, 256, 2, "single", "analytic", None),     # C_g 48: a partial K tile, analytic masks it
    (256, 128, 4, "single", "optimized", 32),     # K_g 32: a 32-wide tile
    (72, 96, 3, "single", "analytic", 32),        # C_g 24 (a partial K tile), K_g 32
])
def test_group_mode_iterator_and_tile(c, k, groups, mode, iterator, tile_n):
    kern = grouped_conv.choose(problem(c, k, groups), "sm90a", 132)
    assert (kern.group_mode, kern.iterator) == (mode, iterator)
    k_g = k // groups
    tn = kern.config.tile[1]
    assert k_g % tn == 0 and tn >= 32
    if tile_n is not None:
        assert tn == tile_n
    assert grouped_conv.waste(problem(c, k, groups)) <= grouped_conv.MAX_WASTE


def test_many_ctas_take_the_larger_tile_few_the_smaller():
    big = grouped_conv.choose(problem(256, 256, 4, h=56, n=32), "sm90a", 132)
    small = grouped_conv.choose(problem(256, 256, 4, h=7, n=1), "sm90a", 132)
    assert big.config.tile[0] * big.config.tile[1] > small.config.tile[0] * small.config.tile[1]


@pytest.mark.parametrize("c, k, groups, dtype, words", [
    (128, 128, 32, "f16", "K / groups = 4, not a multiple of 32"),  # ResNeXt's 4 per group
    (256, 256, 16, "f16", "K / groups = 16, not a multiple of 32"),  # needs a 16-wide tile
    (64, 512, 16, "f16", "8x the useful MMA work"),         # C_g 4 in 32-channel K tiles
    (64, 128, 64, "f16", "at least 4 bytes"),               # a channel multiplier: 1 per group
    (128, 128, 4, "f32", "fp32"),
    (96, 72, 3, "f16", "K / groups = 24"),                  # 24: no tile's N divides it
])
def test_other_grouped_convs_have_a_reason(c, k, groups, dtype, words):
    p = problem(c, k, groups, dtype=dtype) if dtype != "f32" else ConvProblem(
        c=c, k=k, h=14, w=14, r=3, s=3, dtype="f32", align_a=4, align_b=4, align_c=4,
        groups=groups, tf32=True)
    why = grouped_conv.reason(p)
    assert why is not None and words in why, why
    with pytest.raises(ValueError, match="grouped conv|fp32"):
        grouped_conv.choose(p, "sm90a", 132)


def test_model_reasons_reach_the_report(grouped_on):
    for model, words in ((Grouped(c=128, k=128, groups=32), "several-groups-per-tile"),
                         (Grouped(c=64, k=512, groups=16), "MMA work")):
        plan = plan_of(model)
        (fb,) = plan.fallbacks
        assert words in fb.reason and not plan.regions, fb.reason


def test_emitted_kernel_is_the_grouped_fprop_with_its_groups_compiled_in():
    for c, k, groups, mode in ((128, 256, 4, "kSingleGroup"), (96, 96, 3, "kSingleGroup")):
        kern = grouped_conv.choose(problem(c, k, groups), "sm90a", 132)
        src = emit_kernel(kern)
        assert "cutlass/conv/kernel/default_conv2d_group_fprop.h" in src.includes
        assert "DefaultConv2dGroupFprop" in src.code and f"GroupMode::{mode}" in src.code
        assert f"constexpr int kGroups = {groups};" in src.code
        # one access reads one group's channels: C / groups checked against the alignment
        assert "(a.c / kGroups) % kAlignA" in src.code
    plain = emit_kernel(ConvKernel(arch="sm90a", dtype="f16", align_a=8, align_b=8, align_c=8,
                                   epilogue=GemmEpilogue(), config=sm80.conv_configs("f16", 8, 8, 8)[1]))
    assert "DefaultConv2dGroupFprop" not in plain.code and "kGroups = 1;" in plain.code


def test_kernel_refuses_what_cutlass_cannot_build():
    cfg = sm80.conv_configs("f16", 8, 8, 8)[1]
    common = dict(arch="sm90a", dtype="f16", align_a=8, align_b=8, align_c=8, config=cfg)
    with pytest.raises(ValueError, match="group_mode"):
        ConvKernel(epilogue=GemmEpilogue(), groups=4, **common)
    with pytest.raises(ValueError, match="group_mode"):    # wrong rows on the H200
        ConvKernel(epilogue=GemmEpilogue(), groups=4, group_mode="multiple", **common)
    with pytest.raises(ValueError, match="analytic or the optimized"):
        ConvKernel(epilogue=GemmEpilogue(), groups=4, group_mode="single",
                   iterator="few_channels", **common)
    with pytest.raises(ValueError, match="residual"):
        emit_kernel(ConvKernel(epilogue=GemmEpilogue(residual="add"), groups=4, group_mode="single",
                               iterator="analytic", **common))
    with pytest.raises(ValueError, match="groups"):
        ConvProblem(c=64, k=60, h=8, w=8, r=3, s=3, dtype="f16", align_a=8, align_b=8, align_c=4,
                    groups=8)


def test_a_folder_keeps_the_grouped_setting_it_was_compiled_with(tmp_path, monkeypatch):
    """The load partitions the saved program again: with the setting saved in the
    folder's options, not the one in the environment (no nvcc: the fake one). A folder
    saved before the option existed (grouped convs were off by default then) loads
    without them."""
    import json

    import cutlass_offload as co
    from fault_helpers import fake_env
    for k, v in fake_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    model = Grouped(c=128, k=128, groups=4).eval()
    x = torch.randn(2, 128, 14, 14, dtype=H).contiguous(memory_format=torch.channels_last)
    monkeypatch.delenv("CUTLASS_OFFLOAD_GROUPED_CONV", raising=False)
    on = co.compile(model, (x,), arch="sm_90a", out_dir=tmp_path / "on", glue="eager")
    assert [k.groups for k in on.plan.kernels] == [4]
    monkeypatch.setenv("CUTLASS_OFFLOAD_GROUPED_CONV", "0")
    loaded, _, _ = co.load(tmp_path / "on", reference=False)
    assert [k.groups for k in loaded.plan.kernels] == [4]
    off = co.compile(model, (x,), arch="sm_90a", out_dir=tmp_path / "off", glue="eager")
    assert not off.plan.regions
    from cutlass_offload.folder import _manifest_checksum
    manifest = json.loads((tmp_path / "off" / "manifest.json").read_text())
    del manifest["options"]["grouped_conv"]    # an older folder: no grouped_conv option
    manifest["checksum"] = _manifest_checksum(manifest)
    (tmp_path / "off" / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.delenv("CUTLASS_OFFLOAD_GROUPED_CONV")
    loaded, _, _ = co.load(tmp_path / "off", reference=False)
    assert not loaded.plan.regions


def test_the_report_names_grouped_and_depthwise_convs(grouped_on):
    from cutlass_offload.report import Report

    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.dw = nn.Conv2d(128, 128, 3, padding=1, groups=128).half()
            self.gr = nn.Conv2d(128, 128, 3, padding=1, groups=4).half()

        def forward(self, x):
            return torch.relu(self.gr(self.dw(x)))

    x = torch.randn(2, 128, 14, 14, dtype=H).contiguous(memory_format=torch.channels_last)
    options = CompileOptions()
    plan = select(partition(capture(Both().eval(), (x,), dynamic_batch=True).graph_module, options),
                  "sm90a", options)
    text = Report.from_plan(plan).format()
    assert "conv2d[depthwise]:bias x1" in text and "conv2d[grouped]:bias_relu x1" in text, text
