"""GPU property tests (hypothesis) for conv2d kernels: random problem sizes, padding
(asymmetric), stride, dilation and values on a fixed set of compiled kernel classes,
each against a float32 reference.

A conv kernel takes every size at run time, so one library built from prototype
regions serves any problem of the same class (dtype, alignments, epilogue):
hypothesis draws N, C, H, W, K, R, S, padding, stride and dilation freely (C and
K multiples of the class's alignments) and runs the prototype's kernel on them
through a ConvRegionModule bound to the same library symbol. By default a
derandomized subset runs; CUTLASS_OFFLOAD_PROPERTY_EXAMPLES=500 runs that many
random ones. A failure found here becomes a case in conv_cases.py.
"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from cutlass_offload.ir import replace
from helpers import (TOLERANCE, check_conv_call, conv_operands, conv_region_module, draw_conv_problem,
                     poison_allocator, property_settings, prototype_regions, rel_err)

pytestmark = pytest.mark.gpu
PROPERTY_SETTINGS = property_settings()

ACT = {"relu": torch.relu, "silu": F.silu, "gelu": F.gelu, "none": lambda y: y}
# (name, dtype, prototype C, K, act, residual: none | full_add | channel_mul, filter R = S).
# On sm_90a the C < 8 classes take the im2col lowering onto the sm90 GEMM and the 1x1
# class the direct one (families/conv_gemm_sm90.py); on sm_80 they are 2.x kernels.
CLASSES = [
    ("tma_relu", torch.float16, 32, 64, "relu", "none", 3),
    ("tma_bf16_silu_res", torch.bfloat16, 16, 32, "silu", "full_add", 3),
    ("tma_vec_mul", torch.float16, 24, 40, "relu", "channel_mul", 3),
    ("sm80_c_odd", torch.float16, 3, 16, "none", "none", 3),
    ("sm80_k_odd_gelu", torch.float16, 12, 21, "gelu", "none", 3),
    ("sm80_bf16_align2", torch.bfloat16, 6, 10, "relu", "full_add", 3),
    ("im2col_bf16_silu_res", torch.bfloat16, 4, 32, "silu", "full_add", 3),
    ("direct_relu_res", torch.float16, 64, 48, "relu", "full_add", 1),
]


def forward_class(cls, x, w, b, r, pad, stride, dilation):
    act, res = cls[4], cls[5]
    top, bottom, left, right = pad
    y = F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, stride=stride, dilation=dilation)
    y = ACT[act](y)
    if res == "full_add":
        y = y + r
    elif res == "channel_mul":
        y = y * r
    return y


class Prototypes(torch.nn.Module):
    """One conv region per class, R x R filters, 'same' padding, stride 1 (the sizes
    don't matter)."""

    def forward(self, *xs):
        outs = []
        for i, cls in enumerate(CLASSES):
            x, w, b, r = xs[4 * i:4 * i + 4]
            p = cls[6] // 2
            outs.append(forward_class(cls, x, w, b, r, (p, p, p, p), (1, 1), (1, 1)))
        return tuple(outs)


def _proto_inputs():
    xs = []
    for _, dt, c, k, _, res, rs in CLASSES:
        r = {"none": torch.zeros(0), "full_add": torch.randn(2, k, 8, 8),
             "channel_mul": torch.randn(1, k, 1, 1)}[res]
        xs += [torch.randn(2, c, 8, 8).to(dt).contiguous(memory_format=torch.channels_last),
               torch.randn(k, c, rs, rs).to(dt), torch.randn(k).to(dt), r.to(dt)]
    return tuple(xs)


@pytest.fixture(scope="module")
def prototypes():
    mods, compiled = prototype_regions(Prototypes(), _proto_inputs(), len(CLASSES))
    families = {m.kernel.config.family for m in mods}
    assert families == {"cutlass3x_sm90", "cutlass2x_sm80"} or compiled.plan.arch == "sm80"
    if compiled.plan.arch == "sm90a":
        lowered = {cls[0]: m.kernel.iterator for cls, m in zip(CLASSES, mods)}
        assert lowered["sm80_c_odd"] == lowered["im2col_bf16_silu_res"] == "im2col"
        assert lowered["direct_relu_res"] == "direct"
    return mods


@PROPERTY_SETTINGS
@given(data=st.data())
def test_random_conv_problems_match_float32_reference(prototypes, data):
    for cls, proto in zip(CLASSES, prototypes):
        name, dt, _, _, _, res, _ = cls
        p, pad, stride, dilation = draw_conv_problem(data, name, proto)
        x, wt, b = conv_operands(p.n, p.c, p.h, p.w, p.k, p.r, p.s, dt)
        check_conv_call(conv_region_module(proto, p), f"{name} {p}", x, wt, b, res, p.k,
                        lambda *t: forward_class(cls, *t, pad, stride, dilation))


def test_im2col_in_row_chunks_matches_float32_reference(prototypes):
    """A stem whose im2col matrix exceeds IM2COL_CHUNK_BYTES runs as several pack +
    GEMM chunks (20 x 3 x 224 x 224, 7x7 stride 2: 250880 rows of 152 > 64 MiB)."""
    from cutlass_offload.families.conv_gemm_sm90 import IM2COL_CHUNK_BYTES, packed_k
    cls, proto = next((c, m) for c, m in zip(CLASSES, prototypes) if c[0] == "sm80_c_odd")
    if proto.kernel.iterator != "im2col":
        pytest.skip("the im2col lowering is sm_90a's")
    problem = replace(proto.region.problem, n=20, n_hint=20, h=224, w=224, r=7, s=7,
                      pad=(3, 3, 3, 3), stride=(2, 2))
    assert 20 * 112 * 112 * packed_k(problem) * 2 > IM2COL_CHUNK_BYTES
    x = torch.randn(20, 3, 224, 224, device="cuda").half().contiguous(memory_format=torch.channels_last)
    wt = (torch.randn(16, 3, 7, 7, device="cuda") / 147 ** 0.5).half()
    b = torch.randn(16, device="cuda").half()
    poison_allocator()
    with torch.no_grad():
        out = conv_region_module(proto, problem)(x, wt, b)
    torch.cuda.synchronize()
    ref = forward_class(cls, x.float(), wt.float(), b.float(), None, (3, 3, 3, 3), (2, 2), (1, 1))
    assert not out.isnan().any()
    assert rel_err(out, ref) < TOLERANCE[torch.float16]


def test_im2col_keeps_inf_inside_its_window(prototypes):
    """Element copies and exact zeros: an inf in x reaches only the outputs whose
    window holds it, as in PyTorch (CUTLASS 2.x's few-channels iterator would leak
    it into a neighbour through 0 * inf)."""
    cls, proto = next((c, m) for c, m in zip(CLASSES, prototypes) if c[0] == "sm80_c_odd")
    if proto.kernel.iterator != "im2col":
        pytest.skip("the im2col lowering is sm_90a's")
    problem = replace(proto.region.problem, n=1, n_hint=1, h=16, w=16)
    x = torch.randn(1, 3, 16, 16, device="cuda").half()
    x[0, 1, 7, 9] = float("inf")
    x = x.contiguous(memory_format=torch.channels_last)
    wt = torch.rand(16, 3, 3, 3, device="cuda").half() + 0.1      # positive: inf stays inf
    b = torch.zeros(16, device="cuda").half()
    with torch.no_grad():
        out = conv_region_module(proto, problem)(x, wt, b)
    ref = F.conv2d(x.float(), wt.float(), b.float(), padding=1)
    assert torch.equal(out.isinf(), ref.isinf()) and out.isinf().sum() == 9 * 16
    finite = ~ref.isinf()
    assert rel_err(out[finite], ref[finite]) < TOLERANCE[torch.float16]
