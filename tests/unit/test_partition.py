"""Partition (no nvcc, no GPU): what is offloaded, with which epilogue, and what
falls back with which reason."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.partition import partition
from cutlass_offload.select import select
from gemm_cases import (SuiteModel, conformance_cases, example_dims, suite_dynamic_shapes,
                        suite_inputs)

H = torch.float16


def regions_of(fn, *inputs, options=CompileOptions(), dynamic_shapes=None):
    class M(nn.Module):
        def forward(self, *xs):
            return fn(*xs)
    if dynamic_shapes is not None:
        dynamic_shapes = (tuple(dynamic_shapes),)     # forward(*xs)
    cap = capture(M(), inputs, dynamic_shapes=dynamic_shapes)
    return partition(cap.graph_module, options)


def r(*shape, dtype=H):
    return torch.randn(*shape).to(dtype)


def test_conformance_cases_all_offload():
    cases = conformance_cases()
    cap = capture(SuiteModel(cases), suite_inputs(cases, example_dims(cases), H),
                  dynamic_shapes=suite_dynamic_shapes(cases))
    part = partition(cap.graph_module)
    assert len(part.regions) == len(cases)
    assert part.fallbacks == ()
    tags = [reg.problem.epilogue.tag for reg in part.regions]
    assert tags[19] == "bias_relu_resadd_relu"
    assert tags[-1] == "resadd"      # (1,4,16) full-shape bias = residual source


def test_linear_bias_gelu_residual():
    part = regions_of(lambda x, w, b: F.gelu(F.linear(x, w, b)) + x, r(4, 5, 16), r(16, 16), r(16))
    (reg,) = part.regions
    ep = reg.problem.epilogue
    assert (reg.form, ep.bias, ep.activation, ep.residual) == ("linear", True, "gelu_erf", "add")
    assert reg.problem.layout_b == "col" and reg.batch_mode == "fold"
    assert reg.problem.m_hint == 20


@pytest.mark.parametrize("act,name", [(torch.relu, "relu"), (F.silu, "silu"), (torch.sigmoid, "sigmoid"),
                                      (lambda t: F.gelu(t, approximate="tanh"), "gelu_tanh"),
                                      (F.hardswish, "hardswish"), (F.hardsigmoid, "hardsigmoid")])
def test_activations(act, name):
    part = regions_of(lambda x, w: act(x @ w), r(8, 16), r(16, 24))
    assert part.regions[0].problem.epilogue.activation == name


@pytest.mark.parametrize("form", ["x*sig(1.702x)", "sig(x*1.702)*x"])
def test_quick_gelu_is_one_activation(form):
    """x * sigmoid(1.702 * x) (CLIP's quick_gelu): x has two users, taken as a whole."""
    def qg(t):
        return t * torch.sigmoid(1.702 * t) if form == "x*sig(1.702x)" else torch.sigmoid(t * 1.702) * t
    (reg,) = regions_of(lambda x, w, b, c: qg(F.linear(x, w, b)) + c, r(8, 16), r(24, 16), r(24),
                        r(8, 24)).regions
    assert reg.problem.epilogue.tag == "bias_qgelu_resadd"
    assert len(reg.nodes) == 5          # linear, mul (scale), sigmoid, mul, add


@pytest.mark.parametrize("case", ["other_scale", "scale_leaks", "sigmoid_leaks", "after_residual"])
def test_quick_gelu_lookalikes_stay_out(case):
    def f(x, w, c):
        y = x @ w
        if case == "after_residual":
            y = y + c
        a = y * (1.5 if case == "other_scale" else 1.702)
        s = torch.sigmoid(a)
        out = y * s
        if case == "scale_leaks":
            return out, a
        if case == "sigmoid_leaks":
            return out, s
        return out
    (reg,) = regions_of(f, r(8, 16), r(16, 24), r(8, 24)).regions
    assert reg.problem.epilogue.activation == "identity"
    if case == "after_residual":
        assert reg.problem.epilogue.residual == "add"
        assert any("quick" not in n and "activation" in n for n in reg.notes), reg.notes


def test_conv_takes_hardswish_and_quick_gelu():
    x = r(2, 16, 8, 8).contiguous(memory_format=torch.channels_last)
    regs = regions_of(lambda x, w, b: (F.hardswish(F.conv2d(x, w, b, padding=1)),
                                       (lambda t: t * torch.sigmoid(1.702 * t))(F.conv2d(x, w, padding=1))),
                      x, r(32, 16, 3, 3), r(32)).regions
    assert [g.problem.epilogue.tag for g in regs] == ["bias_hswish", "qgelu"]


def test_handwritten_tanh_gelu_is_fused():
    import math

    def new_gelu(t):   # transformers' NewGELUActivation
        return 0.5 * t * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (t + 0.044715 * torch.pow(t, 3.0))))
    part = regions_of(lambda x, w, b: new_gelu(torch.addmm(b, x, w)), r(8, 16), r(16, 24), r(24))
    (reg,) = part.regions
    assert reg.form == "addmm" and reg.problem.epilogue.activation == "gelu_tanh"


def test_conv1d_view_is_sunk_past_epilogue():
    """GPT-2's Conv1D: view(addmm(b, x.view(-1, K), w)) + residual fuses."""
    def f(x, w, b):
        y = torch.addmm(b, x.view(-1, 16), w).view(4, 5, 16)
        return y + x
    (reg,) = regions_of(f, r(4, 5, 16), r(16, 16), r(16)).regions
    assert reg.problem.epilogue.tag == "bias_resadd"


def test_weight_layouts():
    a = regions_of(lambda x, w: x @ w, r(8, 16), r(16, 24)).regions[0]
    b = regions_of(lambda x, w: x @ w.t(), r(8, 16), r(24, 16)).regions[0]
    assert a.problem.layout_b == "row" and b.problem.layout_b == "col"


def test_alignment_from_shapes():
    reg = regions_of(lambda x, w: x @ w, r(1, 15), r(15, 105)).regions[0]
    assert (reg.problem.align_a, reg.problem.align_b, reg.problem.align_c) == (1, 1, 1)
    reg = regions_of(lambda x, w: x @ w, r(3, 12), r(12, 20)).regions[0]
    assert (reg.problem.align_a, reg.problem.align_b, reg.problem.align_c) == (4, 4, 4)


def test_batch_modes():
    fold = regions_of(lambda x, w: x @ w, r(3, 6, 32, 8), r(8, 10)).regions[0]
    batched = regions_of(lambda x, w: x @ w, r(6, 32, 8), r(6, 8, 10)).regions[0]
    bcast = regions_of(lambda x, w: x @ w, r(32, 8), r(6, 8, 10)).regions[0]
    assert (fold.batch_mode, batched.batch_mode, bcast.batch_mode) == ("fold", "batched", "a_broadcast")
    assert fold.problem.m == 3 * 6 * 32


def test_partial_batch_broadcast_expands():
    part = regions_of(lambda x, w: x @ w, r(5, 1, 32, 8), r(5, 3, 8, 10))
    (reg,) = part.regions
    assert reg.batch_mode == "expand" and reg.problem.batch == 15 and not reg.problem.a_batch_broadcast


def test_mixed_dtypes_fall_back():
    part = regions_of(lambda x, w: x @ w.half(), r(8, 16, dtype=torch.bfloat16).float(), r(16, 8))
    assert not part.regions and "mixed input dtypes" in part.fallbacks[0].reason


def test_fp32_needs_tf32_opt_in():
    x, w = r(8, 16, dtype=torch.float32), r(16, 8, dtype=torch.float32)
    part = regions_of(lambda x, w: x @ w, x, w)
    assert not part.regions and "TF32" in part.fallbacks[0].reason
    part = regions_of(lambda x, w: x @ w, x, w, options=CompileOptions(allow_tf32=True))
    assert part.regions[0].problem.tf32


def test_dynamic_k_falls_back():
    k = torch.export.Dim("k", min=2, max=64)
    part = regions_of(lambda x, w: x @ w, r(8, 16), r(16, 8), dynamic_shapes=({1: k}, {0: k}))
    assert not part.regions and "dynamic K" in part.fallbacks[0].reason


def test_dynamic_batch_offloads():
    b = torch.export.Dim("b", min=2, max=64)
    (reg,) = regions_of(lambda x, w: x @ w, r(8, 16), r(16, 8), dynamic_shapes=({0: b}, None)).regions
    assert reg.problem.m is None and reg.problem.m_hint == 8


def test_intermediate_used_outside_stops_epilogue():
    def f(x, w, b):
        y = x @ w + b
        return torch.relu(y), y.sum()
    (reg,) = regions_of(f, r(8, 16), r(16, 8), r(8)).regions
    assert reg.problem.epilogue.tag == "bias"       # relu not fused: y leaks out
    assert any("used 2 times" in n for n in reg.notes)


def test_residual_depending_on_own_output_is_refused():
    """The check itself: a residual computed from the GEMM's output is refused."""
    from cutlass_offload.partition import checks

    def f(x, w):
        y = x @ w
        return torch.relu(y) + torch.sin(y)
    gm = torch.fx.symbolic_trace(f)
    nodes = {n.name: n for n in gm.graph.nodes}
    state = checks.EpilogueState(anchor=nodes["matmul"], operands=None, out=nodes["relu"])
    assert checks.other_independent_of_gemm(state, nodes["add"]) == \
        "residual depends on the GEMM's own output"
    # and through the partitioner: y has two users, so nothing after it joins
    part = regions_of(f, r(8, 16), r(16, 16))
    assert part.regions[0].problem.epilogue.tag == "plain"


def test_broadcast_residual_not_fused():
    (reg,) = regions_of(lambda x, w, s: x @ w + s, r(4, 8, 16), r(16, 16), r(4, 8, 1)).regions
    assert reg.problem.epilogue.tag == "plain"
    assert any("broadcasts" in n for n in reg.notes)


def test_model_without_gemm_has_no_region():
    part = regions_of(lambda x: torch.relu(x) * 2, r(4, 4))
    assert part.regions == () and part.fallbacks == ()


def test_small_m_never_gets_the_largest_tile():
    reg = regions_of(lambda x, w: x @ w, r(77, 768), r(768, 1280)).regions[0]
    plan = select(partition_result(reg), "sm90a")
    assert plan.kernels[0].config.tile[0] == 64
    big = regions_of(lambda x, w: x @ w, r(4096, 64), r(64, 4096)).regions[0]
    assert select(partition_result(big), "sm90a").kernels[0].config.tile == (128, 256, 64)


def test_odd_alignment_goes_to_cutlass2x_on_hopper():
    reg = regions_of(lambda x, w: x @ w, r(1, 15), r(15, 105)).regions[0]
    k = select(partition_result(reg), "sm90a").kernels[0]
    assert k.config.family == "cutlass2x_sm80" and k.arch == "sm90a"


def partition_result(reg):
    from cutlass_offload.ir import PartitionResult
    return PartitionResult((reg,), ())


def test_gelu_approximate_given_by_position():
    """aten.gelu(x, "tanh") written positionally is the tanh form, not erf."""
    from cutlass_offload.partition import checks
    g = torch.fx.Graph()
    x = g.placeholder("x")
    pos = g.call_function(torch.ops.aten.gelu.default, (x, "tanh"))
    kw = g.call_function(torch.ops.aten.gelu.default, (x,), {"approximate": "tanh"})
    plain = g.call_function(torch.ops.aten.gelu.default, (x,))
    name = checks.ACTIVATION_NAMES[torch.ops.aten.gelu.default]
    assert (name(pos), name(kw), name(plain)) == ("gelu_tanh", "gelu_tanh", "gelu_erf")


def test_model_without_supported_op_compiles_and_runs(tmp_path):
    """Nothing to offload: no nvcc, no library, and the model runs (all PyTorch)."""
    import cutlass_offload as co

    class NoGemm(nn.Module):
        def forward(self, x):
            return torch.sigmoid(x) * 3 + x.float().sum().half()
    x = r(4, 6)
    compiled = co.compile(NoGemm(), (x,), arch="sm_80", out_dir=tmp_path / "out")
    assert compiled.plan.regions == () and compiled.library_path is None
    assert torch.equal(compiled(x), NoGemm()(x))
    loaded, reference, inputs = co.load(tmp_path / "out")
    assert torch.equal(loaded(*inputs), reference(*inputs))


def test_not_fused_notes_name_what_stopped_the_epilogue():
    """A scalar factor, and an activation after the residual add, were explained as
    'residual is not a tensor' / 'a second residual' (fresh-user trial, session 54)."""
    lin = lambda x, w, b: F.linear(x, w, b)     # noqa: E731
    xs = (r(8, 16), r(24, 16), r(24))
    (scaled,) = regions_of(lambda x, w, b: lin(x, w, b) * 0.5, *xs).regions
    assert any("a scalar factor: the epilogue has no output scale" in n for n in scaled.notes), scaled.notes
    (late,) = regions_of(lambda x, w, b, res: F.silu(lin(x, w, b) + res), *xs, r(8, 24)).regions
    assert late.problem.epilogue.tag == "bias_resadd"
    assert any("an activation after the residual" in n for n in late.notes), late.notes
