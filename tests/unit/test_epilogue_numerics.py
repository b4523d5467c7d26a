"""The emitted epilogues round where PyTorch's separate ops round and never clamp
(no GPU: the generated text). tests/gpu/test_numerics.py checks the numbers:
the same inf / NaN pattern as PyTorch under fp16 overflow and NaN / inf inputs."""
import functools
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import Fn

from cutlass_offload.capture import capture
from cutlass_offload.emit import emit_kernels
from cutlass_offload.partition import partition
from cutlass_offload.select import select

H = torch.float16
ACTS = {"relu": torch.relu, "gelu_erf": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        "silu": F.silu, "sigmoid": torch.sigmoid, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid,
        "quick_gelu": lambda t: t * torch.sigmoid(1.702 * t)}
FUNCTORS = {"relu": "cutlass::epilogue::thread::ReLu", "gelu_erf": "co_act::GELU",
            "gelu_tanh": "cutlass::epilogue::thread::GELU_taylor", "silu": "co_act::SiLU",
            "sigmoid": "co_act::Sigmoid", "hardswish": "cutlass::epilogue::thread::HardSwish",
            "hardsigmoid": "co_act::HardSigmoid", "quick_gelu": "co_act::QuickGELU"}
# odd N (alignment 1): CUTLASS 2.x kernels on either arch; N = 64: 3.x on sm_90a
SHAPES = {"2x": (12, 40, 63), "3x": (12, 40, 64)}


def sources(fn, inputs, arch):
    cap = capture(Fn(fn), inputs)
    plan = select(partition(cap.graph_module), arch)
    assert plan.regions, plan.fallbacks
    return plan, emit_kernels(plan)


@functools.cache
def _gemm_kernels(family, arch):
    """{(activation, residual?): emitted code}: one capture of every combination."""
    m, k, n = SHAPES[family]
    combos = [(act, res) for act in sorted(ACTS) for res in (False, True)]

    def fn(x, w, b, r):
        return tuple(ACTS[act](F.linear(x, w, b)) + r if res else ACTS[act](F.linear(x, w, b))
                     for act, res in combos)
    inputs = (torch.randn(m, k, dtype=H), torch.randn(n, k, dtype=H), torch.randn(n, dtype=H),
              torch.randn(m, n, dtype=H))
    plan, src = sources(fn, inputs, arch)
    assert len(plan.kernels) == len(combos), plan.fallbacks
    return {c: src[kern.name].code for c, kern in zip(combos, plan.kernels)}, plan


def gemm_code(act, residual, family, arch="sm90a"):
    codes, plan = _gemm_kernels(family, arch)
    assert {k.config.family for k in plan.kernels} == {
        "cutlass3x_sm90" if family == "3x" else "cutlass2x_sm80"}
    return codes[(act, residual)]


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("act", sorted(ACTS))
def test_sm80_epilogue_rounds_bias_add_and_activation_to_the_output_type(act, residual):
    code = gemm_code(act, residual, "2x", "sm80")
    functor = FUNCTORS[act]
    # the activation runs between two round trips through ElementOutput ...
    assert f"{functor}<Fragment> act;" in code
    assert "return widen(narrow(act(widen(narrow(x)))));" in code
    assert "NumericArrayConverter<ElementOutput, T, N, cutlass::FloatRoundStyle::round_to_nearest> narrow;" in code
    # ... and the epilogue uses it, not the bare functor
    epilogue = "LinearCombinationResidualBlock<" if residual else "LinearCombinationGeneric<"
    op = code[code.index(epilogue):code.index(";", code.index(epilogue))]
    assert "RoundedActivation" in op and functor.split("::")[-1] + "," not in op


@pytest.mark.usefixtures("cutlass_tma_epilogue")
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("act", sorted(ACTS))
def test_sm90_evt_rounds_every_node_to_the_output_type(act, residual):
    code = gemm_code(act, residual, "3x")
    nodes = re.findall(r"Sm90Compute<([^,]+), (\w+), ElementCompute, RoundStyle>", code)
    assert len(nodes) == 3 if residual else 2           # + bias, act [, + residual]
    assert all(out == "ElementD" for _, out in nodes), nodes


@pytest.mark.parametrize("arch", ["sm80", "sm90a"])
def test_no_clamping_or_saturating_epilogue(arch):
    """Overflow must give inf (round to nearest), never the largest finite value."""
    for family in ("2x", "3x") if arch == "sm90a" else ("2x",):
        code = gemm_code("gelu_erf", True, family, arch)
        assert "round_to_nearest" in code
        for banned in ("Clamp", "round_toward_zero", "saturate", "Saturate", "__float2half_rz"):
            assert banned not in code, (family, banned)


def test_relu_is_the_nan_propagating_max():
    """CUTLASS's ReLu is maximum<T, PropagateNaN=true> (relu(NaN) = NaN, as PyTorch's);
    a plain fmaxf would return 0."""
    from cutlass_offload.build import toolchain
    header = toolchain.cutlass_root() / "include" / "cutlass" / "epilogue" / "thread" / "activation.h"
    text = header.read_text()
    relu = text[text.index("struct ReLu {"):text.index("using ReLU = ReLu<T>;")]
    assert relu.count("constexpr bool PropagateNaN = true;") == 2


def _group_norm_code(silu):
    x = torch.randn(2, 32, 8, 8, dtype=H).to(memory_format=torch.channels_last)
    w, b = torch.randn(32, dtype=H), torch.randn(32, dtype=H)

    def fn(x, w, b):
        y = F.group_norm(x, 4, w, b)
        return F.silu(y) if silu else y
    plan, src = sources(fn, (x, w, b), "sm80")
    (kernel,) = plan.kernels
    return src[kernel.name].code


def test_group_norm_keeps_the_nan_of_an_inf_input():
    code = _group_norm_code(silu=False)
    assert "fmaxf(m.m2" not in code                # fmaxf(NaN, 0) = 0: finite outputs
    assert "(m.m2 < 0.f ? 0.f : m.m2)" in code


def test_group_norm_rounds_before_its_fused_silu():
    code = _group_norm_code(silu=True)
    body = code[code.index("if (kSilu) {"):]
    assert body.index("o = IO::widen(IO::narrow(o));") < body.index("__expf(-o[j])")


@pytest.mark.parametrize("arch,n", [("sm90a", 64), ("sm80", 63)])
def test_our_activations_header_only_where_used(arch, n):
    """templates/activations.h is inlined into a kernel's unit only when its epilogue
    applies one of our functors: every other kernel's source (and cache key) stays as
    it was."""
    from cutlass_offload.emit.activations import ACTIVATIONS_H

    def fn(x, w, b):
        return (torch.relu(F.linear(x, w, b)), F.hardswish(F.linear(x, w)), F.hardsigmoid(F.linear(x, w, b)),
                (lambda t: t * torch.sigmoid(1.702 * t))(F.linear(x, w, b.sin())))
    plan, src = sources(fn, (torch.randn(12, 40, dtype=H), torch.randn(n, 40, dtype=H), torch.randn(n, dtype=H)),
                        arch)
    with_header = {k.epilogue.activation: ACTIVATIONS_H in src[k.name].preamble for k in plan.kernels}
    assert with_header == {"relu": False, "hardswish": False, "hardsigmoid": True, "quick_gelu": True}, with_header
