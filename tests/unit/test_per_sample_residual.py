"""A conv's per-sample (N, K, 1, 1) residual (the UNet's time embedding): partition lets
it join the conv's region only where the sm90a TMA conv will run it
(CUTLASS_OFFLOAD_PER_SAMPLE_ADD / CompileOptions.per_sample_add), select gives it that
kernel or leaves the add in the glue again, the TMA conv's source reads it through
the per-sample row broadcast, and every other kernel family refuses it."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.emit import conv_gemm_sm90, conv_sm80, conv_sm90
from cutlass_offload.ir import ConvChoice, ConvKernel, ConvRegion
from cutlass_offload.partition import partition
from cutlass_offload.select import conv_tuning_id, select
from cutlass_offload.select.conv import (choose_conv_kernel, keeps_per_sample_residual,
                                         without_per_sample_residual)
from cutlass_offload.families import conv_sm90 as conv_sm90_family

H = torch.float16
ON = CompileOptions(arch="sm90a", per_sample_add=True)


class Fn(torch.nn.Module):
    def __init__(self, fn, **params):
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            self.register_parameter(k, torch.nn.Parameter(v, requires_grad=False))

    def forward(self, *xs):
        return self.fn(self, *xs)


def _temb_block(m, x, t):
    return F.conv2d(x, m.w, m.b, padding=1) + t[:, :, None, None]


def _graph(fn=_temb_block, c=16, k=16, n=2, dynamic_batch=False, groups=1):
    params = dict(w=torch.randn(k, c // groups, 3, 3, dtype=H), b=torch.randn(k, dtype=H))
    x, t = torch.randn(n, c, 8, 8, dtype=H), torch.randn(n, k, dtype=H)
    return capture(Fn(fn, **params), (x, t), dynamic_batch=dynamic_batch).graph_module


def _conv_region(part) -> ConvRegion:
    (r,) = [r for r in part.regions if isinstance(r, ConvRegion)]
    return r


@pytest.mark.parametrize("dynamic_batch", [False, True])
def test_time_embedding_add_joins_the_conv_when_enabled(dynamic_batch):
    r = _conv_region(partition(_graph(dynamic_batch=dynamic_batch), ON))
    ep = r.problem.epilogue
    assert (ep.bias, ep.residual, ep.residual_broadcast, ep.residual_per_sample) == (True, "add", True, True)
    assert r.c is not None and r.nodes[-1].startswith("add") and ep.tag == "bias_ressvecadd"


def test_off_by_default_and_off_the_target_it_stays_in_the_glue_with_the_reason():
    for options, why in ((CompileOptions(arch="sm90a", per_sample_add=False), "CUTLASS_OFFLOAD_PER_SAMPLE_ADD=1"),
                         (CompileOptions(arch="sm80", per_sample_add=True), "sm90a TMA conv")):
        r = _conv_region(partition(_graph(), options))
        assert r.problem.epilogue.residual == "none"
        assert any("per-sample per-channel tensor" in n and why in n for n in r.notes), r.notes


def test_knob_is_read_when_the_option_is_unset(monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_PER_SAMPLE_ADD", "1")
    r = _conv_region(partition(_graph(), CompileOptions(arch="sm90a")))
    assert r.problem.epilogue.residual_per_sample
    monkeypatch.setenv("CUTLASS_OFFLOAD_PER_SAMPLE_ADD", "0")
    r = _conv_region(partition(_graph(), CompileOptions(arch="sm90a")))
    assert not r.problem.epilogue.residual_per_sample


def test_channels_the_tma_conv_cannot_read_keep_the_add_out():
    r = _conv_region(partition(_graph(c=12, k=16), ON))        # C % 8: TMA reads 16-byte channel rows
    assert r.problem.epilogue.residual == "none"
    assert any("C and K multiples of 8" in n for n in r.notes), r.notes


def test_squeeze_excite_style_multiply_after_the_activation_joins():
    fn = lambda m, x, t: torch.relu(F.conv2d(x, m.w, m.b, padding=1)) * t[:, :, None, None]  # noqa: E731
    ep = _conv_region(partition(_graph(fn), ON)).problem.epilogue
    assert (ep.activation, ep.residual, ep.residual_per_sample) == ("relu", "mul", True)


def test_select_gives_the_tma_conv_and_it_reads_the_vector_per_sample():
    part = partition(_graph(), ON)
    plan = select(part, "sm90a", ON)
    (r, k), = [(r, k) for r, k in zip(plan.regions, plan.kernels) if isinstance(r, ConvRegion)]
    assert k.epilogue.residual_per_sample and k.iterator == "" and k.config.family == "cutlass3x_sm90"
    src = conv_sm90.emit(k)
    assert "co_evt::Sm90PerSampleRowBroadcast<TileShape, ElementBias, ElementCompute>" in src.code
    assert "args.p * args.q, args.k" in src.code and "residual[n, k]" in src.code
    assert any("CO_PER_SAMPLE_BROADCAST_H" in block for block in src.preamble)
    # the plain per-channel form keeps its row broadcast and no preamble
    plain = conv_sm90.emit(replace(k, epilogue=replace(k.epilogue, residual_per_sample=False)))
    assert "Sm90PerSampleRowBroadcast" not in plain.code
    assert not any("CO_PER_SAMPLE_BROADCAST_H" in block for block in plain.preamble)


def test_a_conv_whose_best_kernel_is_not_the_tma_conv_leaves_the_add_in_the_glue():
    part = partition(_graph(), ON)
    r = _conv_region(part)
    plain = without_per_sample_residual(r)
    assert plain.nodes == r.nodes[:-1] and plain.c is None and plain.name.endswith("_conv2d_bias")
    assert plain.problem.epilogue == replace(r.problem.epilogue, residual="none", residual_broadcast=False,
                                             residual_per_sample=False)
    assert any("reads no per-sample vector" in n for n in plain.notes)
    tma = choose_conv_kernel(plain.problem, "sm90a", 132)
    im2col = ConvChoice("im2col", tma.config)
    assert keeps_per_sample_residual(r, "sm90a", 132)
    assert not keeps_per_sample_residual(r, "sm90a", 132, im2col)
    # the same through select, with a searched choice for the plain conv
    plan = select(part, "sm90a", ON, tuned={conv_tuning_id(plain.problem): im2col})
    (got, k), = [(g, k) for g, k in zip(plan.regions, plan.kernels) if isinstance(g, ConvRegion)]
    assert got.c is None and not k.epilogue.residual_per_sample and k.iterator == "im2col"


def test_relu_after_the_per_sample_add_leaves_with_it():
    fn = lambda m, x, t: torch.relu(F.conv2d(x, m.w, m.b, padding=1) + t[:, :, None, None])  # noqa: E731
    r = _conv_region(partition(_graph(fn), ON))
    assert r.problem.epilogue.post_activation == "relu"
    plain = without_per_sample_residual(r)
    assert plain.nodes == r.nodes[:-2] and plain.problem.epilogue.post_activation == "identity"


def test_other_families_refuse_a_per_sample_residual():
    r = _conv_region(partition(_graph(), ON))
    k = choose_conv_kernel(r.problem, "sm90a", 132)
    plain = without_per_sample_residual(r).problem
    sm80_kernel = choose_conv_kernel(plain, "sm80", 108)
    with pytest.raises(ValueError, match="per-sample"):
        conv_sm80.check(replace(sm80_kernel, epilogue=r.problem.epilogue))
    with pytest.raises(ValueError):
        conv_gemm_sm90.validate(replace(k, iterator="im2col"))
    with pytest.raises(ValueError, match="sm90a TMA conv only"):
        choose_conv_kernel(r.problem, "sm80", 108)
    assert conv_sm90_family.supports(r.problem)


def test_epilogue_validation_and_tuning_ids_of_other_problems_unchanged():
    from cutlass_offload.ir import GemmEpilogue
    from cutlass_offload.select import epilogue_id
    with pytest.raises(ValueError, match="needs residual_broadcast"):
        GemmEpilogue(residual="add", residual_per_sample=True)
    assert "residual_per_sample" not in epilogue_id(GemmEpilogue(bias=True))
    assert epilogue_id(GemmEpilogue(residual="add", residual_broadcast=True,
                                    residual_per_sample=True))["residual_per_sample"] is True
    assert isinstance(choose_conv_kernel(_conv_region(partition(_graph(), ON)).problem, "sm90a", 132),
                      ConvKernel)
