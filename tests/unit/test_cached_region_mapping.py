"""The per-signature cached mapping (RegionModule._map) of norm, group norm and
attention regions (no GPU: CPU tensors, no launch): a repeat call with fresh tensors
of a cached signature sets the same arguments as the full mapping, field by field,
with the new tensors' pointers, and the same output shape and layout; a pointer
the kernel cannot read (a view at an odd element offset) is never served wrongly."""
import pytest
import torch
import torch.nn.functional as F
from attention_cases import SuiteModel, conformance_cases, extra_cases, suite_inputs
from helpers import Fn, recorded_calls

from cutlass_offload.capture import capture
from cutlass_offload.partition import partition
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.runtime.region import RegionModule
from cutlass_offload.select import select

H = torch.float16
CL = torch.channels_last
POINTERS = {"input", "output", "weight", "bias", "q", "k", "v", "out"}


def region_module(fn, *xs, arch="sm80"):
    cap = capture(Fn(fn), xs)
    gm = offload(cap.graph_module, select(partition(cap.graph_module), arch), library_path=None)
    (mod,) = [m for m in gm.modules() if isinstance(m, RegionModule)]
    return mod


def snapshot(mapped):
    """(result after the launch, {field: value}) of a mapping, or None (the structs are reused)."""
    if mapped is None:
        return None
    out, args, keep = mapped
    fields = {f: getattr(args, f) for f, _ in args._fields_ if f not in ("workspace", "workspace_bytes")}
    return out, fields, keep


def odd_copy(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a view of the same shape and strides one element off 16-byte alignment."""
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    buf = torch.zeros(span + 1, dtype=t.dtype)
    z = buf[1:].as_strided(t.shape, t.stride())
    return z.copy_(t)


def cached_call(mod, ys):
    """mod._map(ys) with the full mapping disabled: only the cached path may answer."""
    def refuse(xs):
        raise AssertionError("the call took the full mapping")
    mod._map_general = refuse
    try:
        return mod._map(ys)
    finally:
        del mod._map_general


def same_mapping(mod, general, cached, ys, in_place=True):
    """The cached mapping of ``ys`` equals the full one: every size / stride field, the
    pointers of the operands read in place (ys' own), a fresh output of the same layout."""
    g_out, g, g_keep = general
    c_out, c, c_keep = cached
    pointers = {f for f in g if f in POINTERS}
    assert {f: v for f, v in c.items() if f not in pointers} == \
           {f: v for f, v in g.items() if f not in pointers}, mod.region.name
    if in_place:
        for i, f in mod._operands:
            assert c[f] == ys[i].data_ptr() == g[f], (mod.region.name, f)
    for f in pointers - {f for _, f in mod._operands} - {"out", "output"}:
        assert (c[f] is None) == (g[f] is None), f            # affine vectors / bias absent alike
    out_field = "out" if "out" in c else "output"
    g_res, c_res = mod._launched(g_out, g_keep), mod._launched(c_out, c_keep)
    assert c[out_field] == (c_out._base if c_out._base is not None else c_out).data_ptr() != g[out_field]
    assert (c_res.shape, c_res.stride(), c_res.dtype) == (g_res.shape, g_res.stride(), g_res.dtype)


NORMS = {
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (64,), w, b, 1e-12), ("w", "b")),
    "layer_norm_no_affine": (lambda x: F.layer_norm(x, (64,)), ()),
    "rms_norm": (lambda x, w: F.rms_norm(x, (64,), w, 1e-6), ("w",)),
    "rms_norm_no_weight": (lambda x: F.rms_norm(x, (64,), None, 1e-6), ()),
}


def norm_inputs(params, shape=(3, 5, 64)):
    return (torch.randn(shape, dtype=H),) + tuple(torch.randn(64, dtype=H) for _ in params)


@pytest.mark.parametrize("name", list(NORMS))
def test_norm_repeat_call_maps_like_the_first(name):
    fn, params = NORMS[name]
    mod = region_module(fn, *norm_inputs(params))
    xs, ys = norm_inputs(params), norm_inputs(params)
    assert mod._map(xs) is not None and len(mod._direct) == 1
    general = snapshot(mod._map_general(ys))
    cached = snapshot(cached_call(mod, ys))
    same_mapping(mod, general, cached, ys)
    assert cached[0].is_contiguous() and mod.copies == 0
    # same signature, pointer 2 bytes off the kernel's vector: refused like the full mapping
    odd = (odd_copy(ys[0]),) + ys[1:]
    assert mod._map_general(odd) is None and cached_call(mod, odd) is None
    if params:
        odd_w = ys[:1] + (odd_copy(ys[1]),) + ys[2:]
        assert mod._map_general(odd_w) is None and cached_call(mod, odd_w) is None
    # a copied (non-contiguous) input is never cached
    xt = torch.randn(64, 15, dtype=H).t()
    assert mod._map((xt,) + ys[1:]) is not None and len(mod._direct) == 1 and mod.copies == 1


GROUP_NORMS = {
    "affine_silu": (lambda x, w, b: F.silu(F.group_norm(x, 8, w, b, 1e-6)), 2),
    "affine": (lambda x, w, b: F.group_norm(x, 8, w, b), 2),
    "no_affine_silu": (lambda x: F.silu(F.group_norm(x, 8)), 0),
}


def gn_inputs(params, n=2):
    x = torch.randn(n, 64, 8, 8, dtype=H).contiguous(memory_format=CL)
    return (x,) + tuple(torch.randn(64, dtype=H) for _ in range(params))


@pytest.mark.parametrize("name", list(GROUP_NORMS))
def test_group_norm_repeat_call_maps_like_the_first(name):
    fn, params = GROUP_NORMS[name]
    mod = region_module(fn, *gn_inputs(params))
    xs, ys = gn_inputs(params, 3), gn_inputs(params, 3)
    assert mod._map(xs) is not None and len(mod._direct) == 1
    general = snapshot(mod._map_general(ys))
    cached = snapshot(cached_call(mod, ys))
    same_mapping(mod, general, cached, ys)
    assert cached[0].shape == (3, 64, 8, 8) and cached[0].is_contiguous(memory_format=CL)
    odd = (odd_copy(ys[0]),) + ys[1:]
    assert odd[0].is_contiguous(memory_format=CL) and odd[0].data_ptr() % 4 == 2
    assert mod._map_general(odd) is None and cached_call(mod, odd) is None
    # an NCHW input is converted per call: mapped in full, not cached
    nchw = (ys[0].contiguous(),) + ys[1:]
    assert mod._map(nchw) is not None and len(mod._direct) == 1 and mod.layout_conversions == 1


@pytest.fixture(scope="module")
def attention_suite():
    """{region name: (module, first inputs, fresh inputs of the same signature)} for
    every attention suite case (tests/attention_cases.py), mapped for sm90a."""
    cases = conformance_cases() + extra_cases()
    cap = capture(SuiteModel(cases), suite_inputs(cases))
    gm = offload(cap.graph_module, select(partition(cap.graph_module), "sm90a"), library_path=None)
    mods = {n: m for n, m in gm.named_children() if isinstance(m, RegionModule)}
    assert len(mods) == len(cases)
    seen = recorded_calls(gm, mods, suite_inputs(cases, seed=0), suite_inputs(cases, seed=7))
    return {n: (mods[n], *seen[n]) for n in mods}


def test_attention_repeat_call_maps_like_the_first(attention_suite):
    cached_regions = misaligned = 0
    for name, (mod, xs, ys) in attention_suite.items():
        mod._direct.clear()
        assert mod._map(xs) is not None, name
        general = snapshot(mod._map_general(ys))
        assert general is not None, name
        in_place = all(general[1][f] == ys[i].data_ptr() for i, f in mod._operands)
        if mod._ib is not None or not in_place:
            # a bias tensor (copied, padded, read for dead rows), -q, skipped or copied
            # rows: mapped in full every call
            assert not mod._direct, name
            again = snapshot(mod._map(ys))
            same_mapping(mod, general, again, ys, in_place=False)
            continue
        assert len(mod._direct) == 1, name
        cached_regions += 1
        cached = snapshot(cached_call(mod, ys))
        same_mapping(mod, general, cached, ys)
        # q misaligned for the kernel's accesses: the full mapping copies it, as before
        if mod.kernel.access * mod._esize > ys[0].element_size():
            odd = list(ys)
            odd[mod._iq] = odd_copy(ys[mod._iq])
            odd = tuple(odd)
            copies = mod.copies
            got = snapshot(mod._map(odd))
            want = snapshot(mod._map_general(odd))
            assert got[1]["q"] != odd[mod._iq].data_ptr() and got[1]["q"] % (mod.kernel.access * mod._esize) == 0
            assert mod.copies == copies + 2
            same_mapping(mod, want, got, odd, in_place=False)
            misaligned += 1
    assert cached_regions >= 20 and misaligned >= 20, (cached_regions, misaligned)


def folded_mask_attention(arch):
    """(attention region module, its input count): SDPA with a causal boolean mask
    built from the dynamic sequence length, folded into the causal argument and
    checked per shape (``mask_check``); no library (the caller sets a launcher)."""
    def fn(q, k, v):
        n = q.shape[2]
        m = torch.arange(n)[:, None] >= torch.arange(n)[None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    s = torch.export.Dim("s", min=2, max=64)
    q, k, v = (torch.randn(2, 4, 16, 64, dtype=H) for _ in range(3))
    cap = capture(Fn(fn), (q, k, v), dynamic_shapes=(({2: s}, {2: s}, {2: s}),))   # *xs
    gm = offload(cap.graph_module, select(partition(cap.graph_module), arch), library_path=None)
    (mod,) = [m for m in gm.modules() if isinstance(m, RegionModule)]
    assert mod.region.mask_check and mod._im is not None and mod._ib is None
    return mod, len([ph for ph in mod.fallback.graph.nodes if ph.op == "placeholder"])


def test_attention_folded_mask_is_checked_on_the_cached_path():
    """A mask folded into the causal argument at dynamic sizes is still checked per
    shape when the signature is cached: a call whose mask is not the pattern falls back."""
    mod, n = folded_mask_attention("sm80")
    q, k, v = (torch.randn(2, 4, 16, 64, dtype=H) for _ in range(3))

    def call(q, k, v, mask):
        xs = [None] * n
        xs[mod._iq], xs[mod._ik], xs[mod._iv], xs[mod._im] = q, k, v, mask
        return tuple(xs)
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    assert mod._map(call(q, k, v, causal)) is not None and len(mod._direct) == 1
    ones = torch.ones(20, 20, dtype=torch.bool)
    q2, k2, v2 = (torch.randn(2, 4, 20, 64, dtype=H) for _ in range(3))
    assert mod._map(call(q2, k2, v2, ones.tril())) is not None and len(mod._direct) == 2
    mod._mask_ok.clear()                  # the pattern is checked again at this shape
    assert cached_call(mod, call(q2, k2, v2, ones)) is None       # not the compiled pattern
    assert mod._map_general(call(q2, k2, v2, ones)) is None
    mod._mask_ok.clear()
    assert cached_call(mod, call(q2, k2, v2, ones.tril())) is not None
