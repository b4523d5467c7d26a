"""GPU: fp16 overflow and NaN / inf inputs give the same inf / NaN pattern as
PyTorch (issue 7, item 6).

The reference is the same module run by PyTorch in the same dtype, not a float32
one: PyTorch rounds each op's result to fp16 (a linear output above 65504 becomes
inf, gelu(-inf) is NaN, inf - x stays inf), and the fused epilogues round at the
same points (emit/epilogue_sm80.py, emit/evt_sm90.py, emit/group_norm.py). An
output agrees when NaN sits at the same elements, infinities at the same elements
with the same signs, and each row's finite values are within the dtype's
norm-wise tolerance.

One library holds every case (one build): GEMM epilogues (bias, relu, gelu erf /
tanh, silu, sigmoid, residual add, post relu, residual mul, no bias) for an
aligned N (CUTLASS 3.x on sm_90a) and an odd N (CUTLASS 2.x), some in bf16;
conv2d (3.x and 2.x); layer / RMS norm; group norm with and without its SiLU
(one-launch and three-launch plans); SDPA. Every input is fresh and random,
outputs are poisoned (NaN) before each run, and every region must run its kernel.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import poison_allocator

import cutlass_offload as co

pytestmark = pytest.mark.gpu
H, B16 = torch.float16, torch.bfloat16
CL = torch.channels_last
ROW_TOL = {H: 1e-2, B16: 3e-2}

GEMM_EPILOGUES = {
    "bias": lambda x, w, b, r: F.linear(x, w, b),
    "relu": lambda x, w, b, r: torch.relu(F.linear(x, w, b)),
    "gelu": lambda x, w, b, r: F.gelu(F.linear(x, w, b)),
    "gelu_tanh": lambda x, w, b, r: F.gelu(F.linear(x, w, b), approximate="tanh"),
    "silu": lambda x, w, b, r: F.silu(F.linear(x, w, b)),
    "sigmoid": lambda x, w, b, r: torch.sigmoid(F.linear(x, w, b)),
    "add": lambda x, w, b, r: F.linear(x, w, b) + r,
    "relu_add_relu": lambda x, w, b, r: torch.relu(torch.relu(F.linear(x, w, b)) + r),
    "gelu_mul": lambda x, w, b, r: F.gelu(F.linear(x, w, b)) * r,
    "no_bias": lambda x, w, b, r: x @ w.t(),
}
# (family, dtype, N, epilogues): N = 64 is 16-byte aligned (3.x on sm_90a), 61 is not (2.x)
GEMM_FAMILIES = [("f16", H, 64, list(GEMM_EPILOGUES)), ("f16_odd", H, 61, list(GEMM_EPILOGUES)),
                 ("bf16", B16, 64, ["gelu", "add", "silu"])]
GEMM_M, GEMM_K = 48, 256
GEMMS = [(f"gemm_{fam}_{ep}", dt, n, ep) for fam, dt, n, eps in GEMM_FAMILIES for ep in eps]

CONV_EPILOGUES = {
    "relu": lambda x, w, b, r: torch.relu(F.conv2d(x, w, padding=1)),
    "bias_silu_add": lambda x, w, b, r: F.silu(F.conv2d(x, w, b, padding=1)) + r,
}
# (family, C, K): C = K = 32 for 3.x on sm_90a; C = 6, K = 10 (alignment 2) for 2.x
CONV_FAMILIES = [("conv", 32, 32), ("conv_odd", 6, 10)]
CONVS = [(f"{fam}_{ep}", c, k, ep) for fam, c, k in CONV_FAMILIES for ep in CONV_EPILOGUES]
CONV_NHW = (2, 8, 8)

NORM_COLS = 256
GROUP_NORMS = [("gn_fused", (2, 32, 8, 8), 4), ("gn_three_launch", (1, 640, 32, 32), 32)]
ATTN = (2, 2, 64, 64)       # B, heads, L, E


class NumericsModel(torch.nn.Module):
    """One output per case; inputs flattened in ``inputs()`` order."""

    def forward(self, *xs):
        outs, i = [], 0
        for _, _, _, ep in GEMMS:
            outs.append(GEMM_EPILOGUES[ep](*xs[i:i + 4]))
            i += 4
        for _, _, _, ep in CONVS:
            outs.append(CONV_EPILOGUES[ep](*xs[i:i + 4]))
            i += 4
        x, w, b = xs[i:i + 3]
        outs.append(F.layer_norm(x, (NORM_COLS,), w, b))
        outs.append(F.rms_norm(x, (NORM_COLS,), w, eps=1e-6))
        i += 3
        for _ in GROUP_NORMS:
            x, w, b = xs[i:i + 3]
            groups = next(g for _, shape, g in GROUP_NORMS if shape[1] == x.shape[1])
            outs.append(F.group_norm(x, groups, w, b))
            outs.append(F.silu(F.group_norm(x, groups, w, b)))
            i += 3
        q, k, v = xs[i:i + 3]
        outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return tuple(outs)


def names():
    out = [n for n, *_ in GEMMS] + [n for n, *_ in CONVS] + ["layer_norm", "rms_norm"]
    for n, *_ in GROUP_NORMS:
        out += [n, n + "_silu"]
    return out + ["sdpa_causal"]


# -- inputs ------------------------------------------------------------------------------

def _gemm_inputs(dt, n, kind, g):
    m, k = GEMM_M, GEMM_K
    # rows from 0.1 to 1000 times the unit scale: products from ~10 to ~1e5 (fp16 max 65504)
    row = torch.logspace(-1, 3, m).unsqueeze(1)
    x = torch.randn(m, k, generator=g) * row
    w = torch.randn(n, k, generator=g) * 8 / math.sqrt(k) * 16
    b = torch.randn(n, generator=g) * 2000
    r = (torch.randn(m, n, generator=g) * row * 128).clamp(-60000, 60000)
    if kind == "overflow":
        b[:4] = torch.tensor([60000.0, -60000.0, 30000.0, -30000.0])   # push finite products over
        r[::5, ::3] = 60000.0 * torch.sign(torch.randn(r[::5, ::3].shape, generator=g))
    else:
        x, r = x / row * 4, r / row * 4                                # moderate: no overflow
        x[1, 3], x[2, 5], x[3, 7] = float("nan"), float("inf"), float("-inf")
        w[4, 0] = float("inf")
        b[5], b[6] = float("nan"), float("-inf")
        r[7, 8], r[8, 9], r[9, 10] = float("-inf"), float("nan"), float("inf")
    return [t.to(dt) for t in (x, w, b, r)]


def _conv_inputs(c, k, kind, g):
    n, h, wd = CONV_NHW
    scale = torch.logspace(-1, 3.5, h).view(1, 1, h, 1)                # overflow in the lower rows
    x = torch.randn(n, c, h, wd, generator=g) * scale
    w = torch.randn(k, c, 3, 3, generator=g) * 8 / math.sqrt(9 * c) * 16
    # no bias with overflowing products: PyTorch adds a conv's bias as a separate op
    # (rounding the product first), the fused epilogue adds it before rounding
    b = torch.zeros(k) if kind == "overflow" else torch.randn(k, generator=g)
    r = torch.randn(n, k, h, wd, generator=g) * scale * 128
    if kind == "overflow":
        r = r.clamp(-60000, 60000)
        r[:, ::3, -2:, :] = 60000.0
    else:
        x, r = x / scale, r / scale / 128
        x[0, 1, 2, 3], x[1, 0, 4, 4] = float("nan"), float("inf")
        w[2, 0, 1, 1] = float("-inf")        # the centre tap: never multiplies the zero padding
        b[3] = float("nan")
        r[0, 4, 5, 6] = float("-inf")
    return [t.to(H).contiguous(memory_format=CL) if t.dim() == 4 else t.to(H) for t in (x, w, b, r)]


def _norm_inputs(kind, g):
    x = torch.randn(16, NORM_COLS, generator=g)
    w = torch.randn(NORM_COLS, generator=g)
    b = torch.randn(NORM_COLS, generator=g)
    x[0, 5] = float("inf")
    x[1, 7] = float("-inf")
    x[2, 9] = float("nan")
    x[3, 0], x[3, 1] = float("inf"), float("-inf")
    x[4] *= 30000.0 / x[4].abs().max()                               # finite, near fp16 max
    if kind == "overflow":
        x[5].zero_()
        x[5, 17], x[6, 17] = 1000.0, -1000.0                             # one spike: ~16 sigma
        w[17] = 8000.0                                                   # 16 * 8000 > 65504
    return [t.to(H) for t in (x, w, b)]


def _group_norm_inputs(shape, groups, kind, g):
    n, c = shape[:2]
    x = torch.randn(shape, generator=g)
    w, b = torch.randn(c, generator=g), torch.randn(c, generator=g)
    per = c // groups
    x[0, 0 * per, 1, 1] = float("inf")                 # group 0 of sample 0: NaN
    x[n - 1, 1 * per + 1, 2, 2] = float("nan")         # group 1 of the last sample: NaN
    if kind == "overflow":                             # a spike of ~sqrt(per * h * w) sigma
        x[0, 2 * per, 3, 3] = 2000.0
        x[0, 3 * per, 3, 3] = -2000.0
        w[2 * per] = w[3 * per] = 8000.0               # +inf and -inf; silu(-inf) = NaN
    else:
        x[0, 2 * per, 0, 0], x[0, 2 * per, 0, 1] = float("inf"), float("-inf")
    return [x.to(H).contiguous(memory_format=CL), w.to(H), b.to(H)]


def _attention_inputs(kind, g):
    q, k, v = (torch.randn(ATTN, generator=g) for _ in range(3))
    if kind == "overflow":       # logits ~1e5: fine in the fp32 softmax of both
        q, k = q * 60, k * 60
        v = (v * 15000).clamp(-60000, 60000)   # finite: an inf in V meets 0 * inf in the rescaling
    else:
        v[0, 0, 10, 3] = float("nan")      # causal: rows >= 10 of (0, 0) NaN
        q[1, 1, 20, 5] = float("nan")      # one NaN query row
        k[1, 0, 40, 0] = float("nan")      # causal: rows >= 40 of (1, 0) NaN
    return [t.to(H) for t in (q, k, v)]


def inputs(kind, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    xs = []
    for _, dt, n, _ in GEMMS:
        xs += _gemm_inputs(dt, n, kind, g)
    for _, c, k, _ in CONVS:
        xs += _conv_inputs(c, k, kind, g)
    xs += _norm_inputs(kind, g)
    for _, shape, groups in GROUP_NORMS:
        xs += _group_norm_inputs(shape, groups, kind, g)
    xs += _attention_inputs(kind, g)
    return tuple(t.to(device) for t in xs)


# -- the comparison ---------------------------------------------------------------------

def assert_same_specials(out, ref, what):
    """NaN / +inf / -inf at the same elements; each row's finite values within tolerance."""
    assert out.shape == ref.shape and out.dtype == ref.dtype, what
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    for name, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        bad = (test(o) != test(r)).nonzero()
        assert len(bad) == 0, (f"{what}: {name} differs at {len(bad)} elements, e.g. "
                               f"{tuple(bad[0].tolist())}: ours {o[tuple(bad[0])]:g}, "
                               f"PyTorch {r[tuple(bad[0])]:g}")
    finite = torch.isfinite(r)
    o2, r2, f2 = (t.reshape(-1, t.shape[-1]) for t in (o, r, finite))
    for i in range(r2.shape[0]):
        a, e = o2[i][f2[i]], r2[i][f2[i]]
        if e.numel():
            err = float((a - e).norm() / e.norm().clamp_min(1e-30))
            assert err <= ROW_TOL[ref.dtype], f"{what}: row {i}: relative error {err:.2e}"


@pytest.fixture(scope="module")
def compiled():
    cap = co.capture(NumericsModel(), inputs("overflow", 0))
    model = co.compile_captured(cap, co.CompileOptions(arch=co.resolve_arch(None))).to("cuda")
    assert len(model.plan.regions) == len(names()), model.report.format()
    return model


def _reference(xs):
    """The same ops in PyTorch, fp16 in and out, with fp32 GEMM reductions throughout.

    Convs run PyTorch's im2col + GEMM path (cuDNN off): cuDNN may pick a Winograd or
    FFT algorithm whose transforms spread one NaN / inf over a whole tile, which is
    not the convolution's own inf / NaN pattern."""
    m = torch.backends.cuda.matmul
    saved = (m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    m.allow_fp16_reduced_precision_reduction = m.allow_bf16_reduced_precision_reduction = False
    try:
        with torch.backends.cudnn.flags(enabled=False):
            return NumericsModel()(*xs)
    finally:
        m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = saved


@pytest.mark.parametrize("kind", ["overflow", "nonfinite"])
@pytest.mark.parametrize("seed", [1, 2])
def test_same_inf_nan_pattern_as_pytorch(compiled, kind, seed):
    xs = inputs(kind, seed, "cuda")
    with torch.no_grad():
        ref = _reference(xs)
        before = [m.fallback_calls for m in compiled.region_modules()]
        poison_allocator()
        outs = compiled(*xs)
    torch.cuda.synchronize()
    ran = [m.fallback_calls == n for m, n in zip(compiled.region_modules(), before)]
    assert all(ran), [m.region.name for m, ok in zip(compiled.region_modules(), ran) if not ok]
    failures = []
    for name, out, r in zip(names(), outs, ref):
        assert r.isfinite().any(), f"{name}: a useless case (nothing finite)"
        try:
            assert_same_specials(out, r, f"{name} ({kind}, seed {seed})")
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


def test_cases_produce_specials(compiled):
    """Guards the test itself: the inputs do overflow and do carry NaN / inf."""
    with torch.no_grad():
        for kind in ("overflow", "nonfinite"):
            ref = _reference(inputs(kind, 3, "cuda"))
            for name, r in zip(names(), ref):
                if kind == "overflow" and name.startswith(("gemm_f16", "conv")) and "sigmoid" not in name:
                    assert r.isinf().any(), f"{name}: no overflow"
                if kind == "nonfinite":
                    assert r.isnan().any() or r.isinf().any(), f"{name}: no NaN / inf"
