"""Depthwise conv2d (no GPU, no nvcc): which depthwise convs become regions on the
direct depthwise kernel (families/depthwise.py), the kernel and C++ they get, and
the reason each other one stays in PyTorch. The build tier checks the kernel's
arithmetic on the host (test_depthwise_emulation.py), tests/gpu the real kernel."""
import json
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.emit import emit_kernel
from cutlass_offload.emit.activations import ACTIVATIONS_H
from cutlass_offload.families import depthwise
from cutlass_offload.ir import ConvProblem, DepthwiseKernel, GemmEpilogue
from cutlass_offload.partition import partition
from cutlass_offload.select import select

H = torch.float16


class DW(nn.Module):
    def __init__(self, c=32, r=7, s=None, stride=1, dilation=1, bias=True, act=None, dtype=H):
        super().__init__()
        s = s or r
        self.conv = nn.Conv2d(c, c, (r, s), stride=stride, padding=(r // 2, s // 2), dilation=dilation,
                              groups=c, bias=bias).to(dtype)
        self.act = act

    def forward(self, x):
        y = self.conv(x)
        return self.act(y) if self.act is not None else y


def plan_of(model, c=32, h=14, dtype=H, options=CompileOptions()):
    x = torch.randn(2, c, h, h, dtype=dtype)
    return select(partition(capture(model.eval(), (x,), dynamic_batch=True).graph_module, options),
                  "sm90a", options)


@pytest.mark.parametrize("kw, act, tag, name", [
    (dict(), None, "bias", "s7_sw1"),                                    # ConvNeXt
    (dict(r=3, stride=2, bias=False), nn.SiLU(inplace=True), "silu", "s3_sw2"),   # EfficientNet
    (dict(r=5), nn.GELU(), "bias_gelu", "s5_sw1"),
    (dict(r=3, s=5), nn.ReLU(), "bias_relu", "s5_sw1"),
])
def test_depthwise_convs_get_the_direct_kernel(kw, act, tag, name):
    plan = plan_of(DW(**kw, act=act))
    assert not plan.fallbacks
    (r,), (k,) = plan.regions, plan.kernels
    assert r.problem.groups == r.problem.c == r.problem.k == 32 and r.problem.depthwise
    assert isinstance(k, DepthwiseKernel) and k.config.family == "direct_depthwise"
    assert k.epilogue.tag == tag and f"_{name}_" in k.name and r.problem.n is None


def test_folded_batch_norm_and_residual_fuse():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)
            self.bn = nn.BatchNorm2d(32)
            self.bn.running_var.uniform_(0.5, 1.5)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x))) + x
    plan = plan_of(Block().half())
    (k,) = plan.kernels
    assert k.epilogue.tag == "bias_relu_resadd"


@pytest.mark.parametrize("kw, c, dtype, options, words", [
    (dict(), 20, H, CompileOptions(), "multiple of 8"),
    (dict(dilation=2), 32, H, CompileOptions(), "dilated"),
    (dict(r=11), 32, H, CompileOptions(), "larger than"),
    (dict(r=3, stride=3), 32, H, CompileOptions(), "horizontal stride 3"),
    (dict(), 32, torch.float32, CompileOptions(allow_tf32=True), "fp32"),
])
def test_other_depthwise_convs_stay_with_a_reason(kw, c, dtype, options, words):
    plan = plan_of(DW(c=c, dtype=dtype, **kw), c=c, dtype=dtype, options=options)
    assert not plan.regions
    (fb,) = plan.fallbacks
    assert words in fb.reason and "depthwise" in fb.reason


def test_problem_and_kernel_refuse_what_they_cannot_be():
    ep = GemmEpilogue(bias=True)
    with pytest.raises(ValueError, match="groups"):      # groups must divide C and K
        ConvProblem(c=32, k=64, h=8, w=8, r=3, s=3, dtype="f16", align_a=8, align_b=1, align_c=8,
                    groups=3)
    with pytest.raises(ValueError, match="filter width"):
        DepthwiseKernel(arch="sm90a", dtype="f16", epilogue=ep, s=11, stride_w=1)
    with pytest.raises(ValueError, match="dtype"):
        DepthwiseKernel(arch="sm90a", dtype="f32", epilogue=ep, s=3, stride_w=1)
    p = ConvProblem(c=32, k=32, h=8, w=8, r=3, s=3, dtype="f16", align_a=8, align_b=1, align_c=8,
                    groups=32, dilation=(2, 2))
    assert depthwise.reason(p) is not None
    with pytest.raises(ValueError, match="dilated"):
        depthwise.choose(p, "sm90a")


@pytest.mark.parametrize("ep, codes", [
    (GemmEpilogue(bias=True), "7, 1, 4, 0, 0, 128, 1, 0, 0, false, 0"),
    (GemmEpilogue(bias=True, activation="silu"), "7, 1, 4, 0, 0, 128, 1, 4, 0, false, 0"),
    (GemmEpilogue(bias=True, activation="relu", residual="add", post_activation="relu"),
     "7, 1, 4, 0, 0, 128, 1, 1, 1, false, 1"),
    (GemmEpilogue(bias=True, residual="mul", residual_broadcast=True),
     "7, 1, 4, 0, 0, 128, 1, 0, 2, true, 0"),
])
def test_emitted_instantiation_carries_the_epilogue(ep, codes):
    k = DepthwiseKernel(arch="sm90a", dtype="bf16", epilogue=ep, s=7, stride_w=1)
    src = emit_kernel(k)
    # the shared template calls the activations' functors, whatever this kernel applies
    assert src.args_type == "CoConvArgs" and src.preamble == (ACTIVATIONS_H,)
    assert f"co_depthwise::run<cutlass::bfloat16_t, {codes}>(" in src.code
    assert f"namespace {k.name} {{" in src.code and "int64_t workspace_size" in src.code


def test_pytorch_runs_the_fallback_of_a_depthwise_region_the_same():
    """The region's fallback subgraph (what runs if the kernel refuses a call) is the
    conv itself: grouped, with its padding."""
    from cutlass_offload.runtime.compiled_model import offload
    model = DW(r=3, act=nn.SiLU()).eval()
    x = torch.randn(2, 32, 14, 14, dtype=H)
    cap = capture(model, (x,), dynamic_batch=True)
    plan = select(partition(cap.graph_module), "sm90a")
    gm = offload(cap.graph_module, plan, library_path=None)
    (mod,) = [m for m in gm.modules() if type(m).__name__ == "ConvRegionModule"]
    xs = (x.float(), model.conv.weight.float(), model.conv.bias.float())
    torch.testing.assert_close(mod.fallback(*xs), F.silu(F.conv2d(*xs, padding=1, groups=32)))


def test_tiled_form_is_named_and_emitted_with_its_shape():
    ep = GemmEpilogue(bias=True, activation="silu")
    rows = DepthwiseKernel(arch="sm90a", dtype="f16", epilogue=ep, s=5, stride_w=2, outputs=2)
    tiled = DepthwiseKernel(arch="sm90a", dtype="f16", epilogue=ep, s=5, stride_w=2, outputs=2,
                            tiled=(1, 4, 256, 2))
    assert tiled.name == rows.name.replace("_q2_", "_q2_t1x4_256b2_") != rows.name
    assert "co_depthwise::run<cutlass::half_t, 5, 2, 2, 1, 4, 256, 2, 4, 0, false, 0>(" in emit_kernel(tiled).code
    for bad in [(1, 4, 256), (3, 4, 256, 1), (1, 4, 512, 1), (1, 4, 256, 8), (1, 4, 256, 1, 0)]:
        with pytest.raises(ValueError, match="tiled"):
            DepthwiseKernel(arch="sm90a", dtype="f16", epilogue=ep, s=5, stride_w=2, tiled=bad)


def _problem(c, h, r, stride, **kw):
    pad = r // 2
    return ConvProblem(n=32, h=h, w=h, c=c, k=c, r=r, s=r, pad=(pad,) * 4, stride=(stride, stride),
                       dilation=(1, 1), groups=c, dtype="f16", align_a=8, align_b=1, align_c=8, **kw)


def test_the_measured_table_picks_the_tiled_form_on_sm90a_only(monkeypatch, tmp_path):
    table = tmp_path / "t.json"
    key = depthwise.key_of(96, 56, 56, 7, 7, (3,) * 4, (1, 1))
    table.write_text(json.dumps({"dtype": "f16", "rows": {key: {"tiled": [1, 4, 256, 1], "us": 1.0}}}))
    monkeypatch.setattr(depthwise, "TABLE_FILE", table)
    depthwise._table.cache_clear()
    try:
        assert depthwise.choose(_problem(96, 56, 7, 1), "sm90a").tiled == (1, 4, 256, 1)
        assert depthwise.choose(_problem(96, 56, 7, 1), "sm80").tiled == ()
        bf16 = ConvProblem(**{**_problem(96, 56, 7, 1).__dict__, "dtype": "bf16"})
        assert depthwise.choose(bf16, "sm90a").tiled == ()                         # measured in fp16
        assert depthwise.choose(_problem(96, 28, 7, 1), "sm90a").tiled == ()     # not measured
        table.write_text("{not json")
        depthwise._table.cache_clear()
        with pytest.warns(UserWarning, match="row form"):
            assert depthwise.choose(_problem(96, 56, 7, 1), "sm90a").tiled == ()
    finally:
        depthwise._table.cache_clear()


def test_the_shipped_table_names_shapes_the_kernel_takes():
    depthwise._table.cache_clear()
    rows = json.loads(depthwise.TABLE_FILE.read_text())["rows"]
    assert rows, "the shipped table is empty"
    for key, row in rows.items():
        ep = GemmEpilogue(bias=True)
        DepthwiseKernel(arch="sm90a", dtype="f16", epilogue=ep, s=3, stride_w=1, tiled=row["tiled"])
        assert row["us"] < row["rows_us"], key         # only where the tiled form ran faster
