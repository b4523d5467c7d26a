"""Conv2d partitioning (no GPU, no nvcc): which convs become regions, with which
padding / epilogue, and which stay in PyTorch with a reason."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.ir import ConvRegion
from cutlass_offload.partition import partition
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.select import select
from conv_cases import SuiteModel, case_id, conformance_cases, extra_cases, suite_inputs

H = torch.float16


class Fn(nn.Module):
    def __init__(self, fn, **params):
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            self.register_parameter(k, nn.Parameter(v, requires_grad=False))

    def forward(self, *xs):
        return self.fn(self, *xs)


def parts(fn, *inputs, options=CompileOptions(), **params):
    cap = capture(Fn(fn, **params), inputs)
    return partition(cap.graph_module, options)


def x_(n=2, c=16, h=8, w=8):
    return torch.randn(n, c, h, w, dtype=H)


def w_(k=16, c=16, r=3, s=3):
    return torch.randn(k, c, r, s, dtype=H)


def test_conv_bias_silu_is_one_region():
    p = parts(lambda m, x: F.silu(F.conv2d(x, m.w, m.b, padding=1)), x_(), w=w_(), b=torch.randn(16, dtype=H))
    (r,) = p.regions
    assert isinstance(r, ConvRegion)
    ep = r.problem.epilogue
    assert (ep.bias, ep.activation, ep.residual) == (True, "silu", "none")
    assert r.problem.pad == (1, 1, 1, 1) and (r.problem.p, r.problem.q) == (8, 8)


def test_zero_pad_folds_into_asymmetric_padding():
    p = parts(lambda m, x: F.conv2d(F.pad(x, (0, 1, 2, 0)), m.w, padding=1), x_(), w=w_())
    (r,) = p.regions
    assert r.problem.pad == (3, 1, 1, 2)           # top, bottom, left, right
    assert r.nodes[0].startswith("pad") and (r.problem.p, r.problem.q) == (10, 9)


def test_reflect_pad_is_not_folded():
    p = parts(lambda m, x: F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), m.w), x_(), w=w_())
    (r,) = p.regions
    assert r.problem.pad == (0, 0, 0, 0) and not r.nodes[0].startswith("pad")


def test_padding_same_with_even_kernel_is_asymmetric():
    p = parts(lambda m, x: F.conv2d(x, m.w, padding="same"), x_(), w=w_(r=4, s=2))
    (r,) = p.regions
    assert r.problem.pad == (1, 2, 0, 1) and (r.problem.p, r.problem.q) == (8, 8)


@pytest.mark.parametrize("what", ["groups", "multiplier"])
def test_grouped_convs_stay_in_pytorch(what):
    # 4 channels per group, and a depthwise conv with a channel multiplier (K = 2C):
    # neither has a kernel (families/grouped_conv.py, tests/unit/test_depthwise.py)
    groups, k = (4, 16) if what == "groups" else (16, 32)
    p = parts(lambda m, x: F.conv2d(x, m.w, groups=groups, padding=1), x_(), w=w_(k=k, c=16 // groups))
    assert not p.regions
    assert p.fallbacks[0].reason.startswith("grouped conv"), p.fallbacks[0].reason


def test_transposed_conv_stays_in_pytorch():
    p = parts(lambda m, x: F.conv_transpose2d(x, m.w), x_(), w=w_())
    assert not p.regions


def test_per_channel_residual_after_activation_is_broadcast():
    p = parts(lambda m, x: torch.relu(F.conv2d(x, m.w, m.b, padding=1)) + m.r, x_(),
              w=w_(), b=torch.randn(16, dtype=H), r=torch.randn(1, 16, 1, 1, dtype=H))
    (r,) = p.regions
    ep = r.problem.epilogue
    assert (ep.activation, ep.residual, ep.residual_broadcast) == ("relu", "add", True)


def test_per_channel_add_right_after_conv_is_the_bias():
    p = parts(lambda m, x: F.conv2d(x, m.w, padding=1) + m.r, x_(), w=w_(), r=torch.randn(16, 1, 1, dtype=H))
    (r,) = p.regions
    assert r.problem.epilogue.bias and r.problem.epilogue.residual == "none"


def test_time_embedding_add_is_left_with_a_reason():
    p = parts(lambda m, x, t: F.conv2d(x, m.w, m.b, padding=1) + t[:, :, None, None], x_(),
              torch.randn(2, 16, dtype=H), w=w_(), b=torch.randn(16, dtype=H))
    (r,) = p.regions
    assert r.problem.epilogue.residual == "none"
    assert any("per-sample per-channel" in n for n in r.notes)


def test_full_residual_then_relu():
    p = parts(lambda m, x: torch.relu(F.conv2d(x, m.w, m.b, padding=1) + x), x_(),
              w=w_(), b=torch.randn(16, dtype=H))
    (r,) = p.regions
    ep = r.problem.epilogue
    assert (ep.residual, ep.post_activation, ep.residual_broadcast) == ("add", "relu", False)


def test_alignment_from_channel_counts():
    p = parts(lambda m, x: F.conv2d(x, m.w, padding=1), x_(c=9), w=w_(k=12, c=9))
    pr = p.regions[0].problem
    assert (pr.align_a, pr.align_b, pr.align_c) == (1, 1, 4)


def test_fp32_conv_needs_tf32():
    p = parts(lambda m, x: F.conv2d(x, m.w), x_().float(), w=w_().float())
    assert not p.regions and "TF32" in p.fallbacks[0].reason
    p = parts(lambda m, x: F.conv2d(x, m.w), x_().float(), w=w_().float(),
              options=CompileOptions(allow_tf32=True))
    assert len(p.regions) == 1


def test_dynamic_spatial_size_falls_back_dynamic_batch_does_not():
    m = Fn(lambda m, x: F.conv2d(x, m.w, padding=1), w=nn.Parameter(w_(), requires_grad=False))
    cap = capture(m, (x_(n=3, h=12),), dynamic_shapes=(({0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO},),))
    p = partition(cap.graph_module)
    assert not p.regions and "dynamic" in p.fallbacks[0].reason
    cap = capture(m, (x_(n=3),), dynamic_batch=True)
    (r,) = partition(cap.graph_module).regions
    assert r.problem.n is None and r.problem.n_hint == 3


def test_batch_norm_folds_into_the_conv_exactly_enough():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()).eval()
    bn = m[1]
    bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2)
    bn.weight.data.uniform_(0.5, 1.5), bn.bias.data.uniform_(-1, 1)
    x = torch.randn(2, 8, 10, 10)
    cap = capture(m, (x,))
    ops = [n.target for n in cap.graph_module.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.batch_norm.default not in ops
    (r,) = partition(cap.graph_module, CompileOptions(allow_tf32=True)).regions
    assert r.problem.epilogue.bias and r.problem.epilogue.activation == "relu"
    torch.testing.assert_close(cap.graph_module(x), m(x), rtol=1e-5, atol=1e-5)


def test_identity_output_scale_is_dropped_so_the_residual_fuses():
    p = parts(lambda m, x: (F.conv2d(x, m.w, padding=1) + x) / 1.0, x_(), w=w_())
    (r,) = p.regions
    assert r.problem.epilogue.residual == "add"


def test_every_suite_case_is_one_region_and_maps_onto_its_kernel():
    """Guards against silent fallbacks in the GPU suite (tests/gpu/test_conv_conformance.py):
    every case is one conv region, and a fresh call fits its kernel (CPU tensors, no launch)."""
    cases = conformance_cases() + extra_cases()
    cap = capture(SuiteModel(cases, H), suite_inputs(cases, H))
    plan = select(partition(cap.graph_module), "sm90a")
    assert len(plan.regions) == len(cases) and not plan.fallbacks, [case_id(c) for c in cases]
    gm = offload(cap.graph_module, plan, library_path=None)
    mods = [m for m in gm.modules() if type(m).__name__ == "ConvRegionModule"]
    assert len(mods) == len(cases)
    for mod in mods:
        xs = [torch.zeros(tuple(ph.meta["val"].shape), dtype=ph.meta["val"].dtype)
              for ph in mod.fallback.graph.nodes if ph.op == "placeholder"]
        xs = [x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x for x in xs]
        mapped = mod._map(tuple(xs))
        assert mapped is not None, mod.region.name
        out, args, _ = mapped
        assert tuple(out.shape) == tuple(mod.region.problem and (xs[0].shape[0], mod.region.problem.k,
                                                                 mod.region.problem.p, mod.region.problem.q))
        assert out.is_contiguous(memory_format=torch.channels_last)
        # a second call with fresh tensors of the same signature takes the cached path:
        # the same sizes, the new tensors' pointers (a zero-padded input is a copy each
        # call, so a padded region maps every call in full)
        padded = mod.region.problem.pad_c > 0
        ys = tuple(t.clone() for t in xs)
        ys = tuple(y.contiguous(memory_format=torch.channels_last) if y.dim() == 4 else y for y in ys)
        again = mod._map(ys)
        assert again is not None and len(mod._direct) == (0 if padded else 1), mod.region.name
        out2, args2, _ = again
        sizes = [f for f, _ in args._fields_ if f not in ("x", "filter", "bias", "residual", "y",
                                                          "workspace", "workspace_bytes")]
        assert [getattr(args2, f) for f in sizes] == [getattr(args, f) for f in sizes]
        assert (args2.x == ys[0].data_ptr()) != padded and args2.y == out2.data_ptr() != args.y
        assert out2.shape == out.shape and out2.is_contiguous(memory_format=torch.channels_last)
    assert sum(m.layout_conversions for m in mods) == 0   # channels_last in, weights prepacked


def test_contiguous_before_a_conv_is_dropped_so_nhwc_needs_no_copy():
    """diffusers' Transformer2DModel: (B, HW, C) -> reshape/permute to NCHW view of NHWC
    memory -> .contiguous() -> 1x1 proj_out conv. Without the contiguous the conv reads the
    NHWC memory directly (no layout conversion), with the same values."""
    class Proj(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Conv2d(16, 16, 1)

        def forward(self, t, h):
            b, c, hh, ww = h.shape
            t = t.reshape(b, hh, ww, c).permute(0, 3, 1, 2).contiguous()
            return self.proj(t) + h

    m = Proj().half()
    t, h = torch.randn(2, 64, 16, dtype=H), torch.randn(2, 16, 8, 8, dtype=H)
    cap = capture(m, (t, h))
    targets = [n.target for n in cap.graph_module.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.contiguous.default not in targets
    plan = select(partition(cap.graph_module), "sm90a")
    (region,) = plan.regions
    assert region.problem.epilogue.residual == "add"
    torch.testing.assert_close(cap.graph_module(t, h), m(t, h))
    gm = offload(cap.graph_module, plan, library_path=None)
    (mod,) = [x for x in gm.modules() if type(x).__name__ == "ConvRegionModule"]
    xs = [None] * 4
    xs[mod._ix] = t.reshape(2, 8, 8, 16).permute(0, 3, 1, 2)    # what the region now receives
    xs[mod._iw] = m.proj.weight.detach().contiguous(memory_format=torch.channels_last)
    xs[mod._ibias] = m.proj.bias.detach()
    xs[mod._ic] = h.contiguous(memory_format=torch.channels_last)
    assert mod._map(tuple(xs)) is not None and mod.layout_conversions == 0


def test_grouped_convs_stay_in_pytorch_with_reasons_and_depthwise_ones_offload():
    import torch.nn as nn

    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions
    from cutlass_offload.partition import partition

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)
            self.gr = nn.Conv2d(32, 64, 3, padding=1, groups=4)

        def forward(self, x):
            return self.gr(self.dw(x))

    x = torch.randn(2, 32, 8, 8, dtype=torch.float16)
    part = partition(capture(M().half(), (x,)).graph_module, CompileOptions(arch="sm90a"))
    (dw,) = part.regions
    assert dw.problem.groups == 32
    (gr,) = (f.reason for f in part.fallbacks)
    # K / groups = 16: the grouped kernels take multiples of 32 (families/grouped_conv.py)
    assert gr.startswith("grouped conv with K / groups = 16"), gr


def test_an_nchw_model_input_is_noted_as_a_copy_per_call():
    """Conv regions read NHWC: a model input in NCHW is copied on every call, which the
    report said nothing about (fresh-user trial, session 54); a channels_last one, and
    the later convs (they read our NHWC outputs), get no such note."""
    import cutlass_offload as co
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(32, 32, 3, padding=1)).half()
    x = torch.randn(2, 3, 16, 16).half()
    notes = [[n for n in r["notes"] if "NCHW" in n] for r in co.explain(m, (x,), arch="sm_90a").report.regions]
    assert [len(n) for n in notes] == [1, 0] and "copied to NHWC on every call" in notes[0][0]
    cl = m.to(memory_format=torch.channels_last)
    rep = co.explain(cl, (x.contiguous(memory_format=torch.channels_last),), arch="sm_90a").report
    assert not any("NCHW" in n for r in rep.regions for n in r["notes"])
