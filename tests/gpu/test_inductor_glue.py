"""GPU: the Inductor glue (regions as opaque custom ops inside torch.compile).

One fp16 model with a region of every kind (GEMM + epilogue, layer norm, SDPA in
both output layouts, conv2d, group norm + SiLU) and glue between them, compiled
once per glue mode; each check uses fresh random inputs, a poisoned allocator
and a float32 reference. Also: the real kernels' output strides against the
fake impl's, Inductor's CUDA graphs (reduce-overhead), a dynamic batch at a
second size, the torch.compile backend, and loading a saved folder without any
nvcc build."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import FakeTensorMode

import cutlass_offload as co
from cutlass_offload.runtime import ops
from helpers import TOLERANCE, poison_allocator, rel_err

pytestmark = pytest.mark.gpu
H = torch.float16


class AllKinds(nn.Module):
    def __init__(self, d=128, heads=4, c=32):
        super().__init__()
        self.heads = heads
        self.lin = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, d)
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.gn = nn.GroupNorm(8, c)

    def forward(self, x, img):
        b, s, d = x.shape
        h = self.ln(F.gelu(self.lin(x)) + x)
        q = (h * 0.5).view(b, s, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q.sin(), q.cos()).transpose(1, 2).reshape(b, s, d)
        st = F.scaled_dot_product_attention(q.cos(), q, q).amax(dim=1)       # read as (B, H, L, E)
        y = torch.tanh(self.out(a)) * 2 + st.sum(-1, keepdim=True)
        z = F.silu(self.gn(self.conv(img.cos()))) + 1
        return y, z


def _inputs(batch=4, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(batch, 32, 128, generator=g, device="cuda").to(H)
    img = torch.randn(batch, 32, 16, 16, generator=g, device="cuda").to(H)
    return x, img.contiguous(memory_format=torch.channels_last)


@pytest.fixture(scope="module")
def eager():
    torch.manual_seed(0)
    return AllKinds().to("cuda", H).to(memory_format=torch.channels_last).eval()


@pytest.fixture(scope="module")
def reference(eager):
    ref = copy.deepcopy(eager).float()
    return lambda *xs: ref(*(x.float() for x in xs))


def _check(out, ref):
    for o, r in zip(out, ref):
        assert o.dtype == H and torch.isfinite(o).all()
        assert rel_err(o, r) < TOLERANCE[H], rel_err(o, r)


@pytest.fixture(scope="module")
def compiled(eager):
    torch._dynamo.reset()
    # every norm a region here (offload_norms "auto" leaves layer norms to Inductor)
    m = co.compile(eager, _inputs(), glue="inductor", dynamic_batch=True, offload_norms="all")
    yield m
    torch._dynamo.reset()


def test_every_kind_offloaded_and_built_beside_the_glue(compiled):
    forms = sorted(r.form for r in compiled.plan.regions)
    assert forms == ["conv2d", "group_norm", "layer_norm", "linear", "linear", "sdpa", "sdpa"]
    assert compiled.plan.fallbacks == ()
    assert compiled.glue == "inductor"
    assert "glue: compile + first call" in compiled.report.phases
    assert "build (beside the glue)" in compiled.report.phases


def test_inductor_glue_matches_fp32_on_fresh_inputs(compiled, reference):
    with torch.no_grad():
        for seed in (1, 2):
            x = _inputs(seed=seed)
            poison_allocator()
            before = {m.region.name: m.calls for m in compiled.region_modules()}
            out = compiled(*x)
            _check(out, reference(*x))
            for m in compiled.region_modules():
                assert m.calls == before[m.region.name] + 1, m.region.name
    assert sum(m.fallback_calls for m in compiled.region_modules()) == 0
    assert compiled.layout_conversions() == 0


def test_plain_calls_replay_in_the_cpp_kernel(compiled, reference):
    """Once a signature is cached, the region op's C++ CUDA kernel (csrc/fast_call.cpp)
    replays the calls of regions whose inputs are all tensors: their Python call
    path count stays put while their call count grows; outputs still match."""
    from cutlass_offload.runtime import ops
    assert ops._op_state["cpp"] is not None, "the C++ kernel of the region op is not installed"
    with torch.no_grad():
        for seed in (3, 4):                       # the first may still cache signatures
            x = _inputs(seed=seed)
            before = {m.region.name: (m.calls, m._calls) for m in compiled.region_modules()}
            out = compiled(*x)
        _check(out, reference(*x))
    replayed = [m.region.name for m in compiled.region_modules()
                if m.calls == before[m.region.name][0] + 1 and m._calls == before[m.region.name][1]]
    linears = [m.region.name for m in compiled.region_modules() if m.region.form == "linear"]
    assert set(linears) <= set(replayed), (replayed, linears)


def test_default_mode_calls_the_region_ops_through_their_c_shims(compiled):
    """Default mode on CUDA: Inductor's C++ wrapper of the glue, calling the region ops
    through their C shims (glue.REGION_C_SHIMS, unless $CUTLASS_OFFLOAD_C_SHIMS=0), and
    neither failed (a failure would have compiled it again without them)."""
    from cutlass_offload.runtime import glue
    g = compiled.inductor
    assert g.failed is None and g.cpp_wrapper_failed is None and g.shims_failed is None
    used = g.used_options or {}
    if not (glue.cpp_wrapper_in_default_mode() and glue.region_c_shims()):
        pytest.skip("the C++ wrapper or its C shims are turned off in this environment")
    og = g._state[1]                                  # the glue's own ops graph
    assert used.get("cpp_wrapper") and set(used[glue.SHIM_OPTION]) == {
        ops.region_op(e.n_tensors, e.n_ints) for e in og.entries}


def test_second_batch_size_without_recompiling(compiled, reference):
    g0 = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        for batch in (7, 2):
            x = _inputs(batch, seed=batch)
            poison_allocator()
            _check(compiled(*x), reference(*x))
    assert counters["stats"]["unique_graphs"] == g0


def test_kernel_outputs_have_the_fake_impls_strides(compiled):
    """The strides Inductor planned with (the fake impl) are the ones the real
    kernels return, before the op's safety copy."""
    seen = {}

    def hook(mod, xs, out):
        seen.setdefault(mod, (xs, out))
    handles = [m.register_forward_hook(hook) for m in compiled.region_modules()]
    try:
        with torch.no_grad():
            compiled(*_inputs(seed=3))
    finally:
        for h in handles:
            h.remove()
    assert len(seen) == len(compiled.plan.regions)
    mode = FakeTensorMode()
    for m, (xs, out) in seen.items():
        e = ops.register(m, ["tensor"] * len(xs))
        with mode:
            fake = ops.call(e, [mode.from_tensor(x) for x in xs])
        assert tuple(fake.shape) == tuple(out.shape), m.region.name
        assert [s for d, s in zip(out.shape, out.stride()) if d != 1] == \
            [s for d, s in zip(fake.shape, fake.stride()) if d != 1], m.region.name


def test_reduce_overhead_runs_in_inductor_cuda_graphs(eager, reference):
    torch._dynamo.reset()
    m = co.compile(eager, _inputs(), glue="inductor", mode="reduce-overhead", offload_norms="all")
    assert m.inductor.cuda_graphs
    with torch.no_grad():
        outs = []
        for seed in range(4, 9):                  # warm-up, record, then replays
            x = _inputs(seed=seed)
            poison_allocator()
            out = [o.clone() for o in m(*x)]
            outs.append((out, reference(*x)))
        for out, ref in outs:
            _check(out, ref)
    with pytest.raises(co.CutlassOffloadError):
        m.cuda_graphed()
    torch._dynamo.reset()


def test_torch_compile_backend_with_mode(eager, reference):
    torch._dynamo.reset()
    be = co.make_backend()
    fast = torch.compile(eager, backend=be, mode="reduce-overhead")
    with torch.no_grad():
        for batch, seed in ((4, 10), (4, 11), (4, 12), (6, 13)):
            x = _inputs(batch, seed)
            poison_allocator()
            out = [o.clone() for o in fast(*x)]
            _check(out, reference(*x))
    c = be.compiled[0]
    kinds = {r.form for r in c.plan.regions}
    assert {"addmm", "sdpa", "conv2d", "group_norm"} <= kinds, kinds
    # offload_norms "auto" under Inductor: the layer norm is Inductor's, by choice
    assert "layer_norm" not in kinds
    assert [f.op for f in c.plan.fallbacks if "by choice" in f.reason] == ["layer_norm"]
    assert sum(m.fallback_calls for m in c.region_modules()) == 0
    torch._dynamo.reset()


def test_backend_by_name(eager, reference):
    if "cutlass_offload" not in torch._dynamo.list_backends(exclude_tags=()):
        pytest.skip("the torch_dynamo_backends entry point is not installed (pip install -e .)")
    torch._dynamo.reset()
    fast = torch.compile(eager, backend="cutlass_offload")
    with torch.no_grad():
        x = _inputs(seed=14)
        poison_allocator()
        _check(fast(*x), reference(*x))
    torch._dynamo.reset()


def test_load_saved_folder_without_building(eager, reference, tmp_path, monkeypatch):
    torch._dynamo.reset()
    out_dir = tmp_path / "m"
    co.compile(eager, _inputs(), glue="inductor", out_dir=out_dir)
    from cutlass_offload import api, build

    def no_build(*a, **k):
        raise AssertionError("load must not build")
    monkeypatch.setattr(build, "build", no_build)
    monkeypatch.setattr(api.build_stage, "build", no_build)
    m, _, _ = co.load(out_dir, device="cuda")
    assert m.glue == "inductor"
    with torch.no_grad():
        x = _inputs(seed=15)
        poison_allocator()
        _check(m(*x), reference(*x))
    assert sum(r.fallback_calls for r in m.region_modules()) == 0
    torch._dynamo.reset()


class HeadDim40Attention(nn.Module):
    def forward(self, x):
        b, s, d = x.shape
        q = x.view(b, s, d // 40, 40).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q.sin(), q.cos()).transpose(1, 2).reshape(b, s, d)


def test_reduce_overhead_from_the_first_call_with_a_workspace():
    """A region with a workspace (the sm90 FMHA's log-sum-exp rows) compiled straight
    into reduce-overhead: Inductor's CUDA graph trees warm up and record with this
    thread's allocations routed to their pool and refuse a pool allocation that
    outlives the call; the region keeps its workspace outside the pool."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the sm90 FMHA needs an sm_90 GPU")
    from cutlass_offload.api import compile_captured
    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions

    torch._dynamo.reset()
    model = HeadDim40Attention()
    x0 = torch.randn(2, 1024, 320, device="cuda").to(H)
    m = compile_captured(capture(model, (x0,)), CompileOptions(arch="sm90a", pytorch_when_faster=False),
                         glue="inductor", mode="reduce-overhead")
    assert [r.form for r in m.plan.regions] == ["sdpa"]
    with torch.no_grad():
        outs = []
        for seed in range(5):                     # warm-up, record, then replays
            x = torch.randn(2, 1024, 320, generator=torch.Generator("cuda").manual_seed(seed),
                            device="cuda").to(H)
            poison_allocator()
            outs.append((m(x).clone(), model(x.float())))
        for out, ref in outs:
            assert rel_err(out, ref) < TOLERANCE[H], rel_err(out, ref)
    (mod,) = m.region_modules()
    assert mod._ws_need > 0 and mod.fallback_calls == 0
    torch._dynamo.reset()
