"""Shared test helpers: tolerances, relative error, allocator poisoning, a learned
GEMM table of the test's own."""
import contextlib
import copy
import json

import torch

# Norm-wise relative error tolerated against a float32 reference, by input dtype.
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-3}


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def poison_allocator(device="cuda", mb=256):
    """Fill the caching allocator's free blocks with NaN so an output the kernel
    never writes shows up as NaN instead of stale data."""
    blocks = [torch.full((n,), float("nan"), dtype=torch.float16, device=device)
              for n in (1 << 10, 1 << 14, 1 << 18, 1 << 22, mb << 19)]
    del blocks


def check_fresh_outputs(compiled, model, shape, dtype, names, rounds=2):
    """Call ``compiled`` on ``rounds`` fresh random inputs with the allocator poisoned
    first, and check each of its outputs (named by ``names``, in order) against
    ``model`` run in float32: same shape, no NaN, norm-wise error under TOLERANCE.
    ``shape``: the one input's shape (CUDA, ``dtype``), or a function of the round
    (0, 1, ...) returning the tuple of inputs."""
    ref_model = copy.deepcopy(model).float()
    for r in range(rounds):
        xs = shape(r) if callable(shape) else (torch.randn(*shape, device="cuda", dtype=dtype),)
        poison_allocator()
        with torch.no_grad():
            outs = compiled(*xs)
            refs = ref_model(*(x.float() for x in xs))
        torch.cuda.synchronize()
        assert len(outs) == len(refs) == len(names)
        for name, out, ref in zip(names, outs, refs):
            assert out.shape == ref.shape, name
            assert not out.isnan().any(), name
            assert rel_err(out, ref) < TOLERANCE[dtype], name


class Fn(torch.nn.Module):
    """A module that calls ``fn`` on its inputs (to capture a function as a model)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def recorded_calls(gm, mods, *input_sets):
    """{region name: [its inputs in each forward of ``gm``]} for the region modules
    ``mods`` ({name: module}) of an offloaded graph, each forward run without a GPU
    (the regions run their PyTorch fallback)."""
    seen = {n: [] for n in mods}

    def recording(name, m):
        def forward(*xs):
            seen[name].append(xs)
            return m.fallback(*xs)
        return forward
    for name, m in mods.items():
        m.forward = recording(name, m)
    with torch.no_grad():
        for xs in input_sets:
            gm(*xs)
    for m in mods.values():
        del m.forward
    return seen


def check_batches(compiled, model, make_input, batches, dtype=torch.float16):
    """Run ``compiled`` on fresh inputs ``make_input(batch)`` for each batch (outputs
    poisoned first) against a float32 copy of ``model``, within TOLERANCE[dtype];
    then check that no region call fell back to PyTorch."""
    ref_model = copy.deepcopy(model).float()
    for batch in batches:
        x = make_input(batch)
        poison_allocator()
        with torch.no_grad():
            out = compiled(x)
            ref = ref_model(x.float())
        assert rel_err(out, ref) <= TOLERANCE[dtype], batch
    assert sum(mod.fallback_calls for mod in compiled.region_modules()) == 0


def _refused(*xs):
    raise AssertionError("the kernel refused a problem of its class")


def conv_region_module(proto, problem, refused=_refused):
    """A ConvRegionModule for ``problem`` bound to the prototype region module
    ``proto``'s kernel and library symbol (a conv kernel takes every size at run
    time); inputs x, w, bias and, when the prototype has one, the residual.
    ``refused``: its PyTorch fallback (by default it fails the test)."""
    from cutlass_offload.ir import replace
    from cutlass_offload.runtime.conv_region import ConvRegionModule
    region = replace(proto.region, problem=problem)
    roles = {"x": 0, "w": 1, "bias": 2}
    if proto.region.c is not None:
        roles["c"] = 3
    return ConvRegionModule(region, proto.kernel, refused, roles, proto._library_getter)


def prototype_regions(model, inputs, count):
    """The region modules of ``model`` compiled on ``inputs`` (one prototype region per
    kernel class of a property test) and moved to the GPU; fails unless there are
    ``count`` of them, with the report."""
    import cutlass_offload as co
    compiled = co.compile(model, inputs).to("cuda")
    mods = compiled.region_modules()
    assert len(mods) == count, compiled.report.format()
    return mods, compiled


def conv_operands(n, c, h, w, k, r, s, dtype):
    """Fresh random conv operands on the GPU: x (N, C, H, W) channels_last, a filter
    (K, C, R, S) scaled by 1 / sqrt(C*R*S) (outputs of order 1) and a bias (K,)."""
    x = torch.randn(n, c, h, w, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
    wt = (torch.randn(k, c, r, s, device="cuda") / (c * r * s) ** 0.5).to(dtype)
    return x, wt, torch.randn(k, device="cuda").to(dtype)


def draw_conv_problem(data, name, proto):
    """A random conv problem for the prototype conv region module ``proto`` (hypothesis
    ``data``; ``name`` labels the draws): C and K multiples of the kernel's
    alignments (C any non-multiple of 8 below 64 for a class whose C is zero-padded),
    N, H, W, filter, padding (asymmetric), stride and dilation drawn freely (1x1,
    no padding, stride 1 for the direct 1x1 lowering). Returns (problem, pad,
    stride, dilation); rejects (hypothesis ``assume``) an empty output and, for a TMA
    class, a problem that kernel does not take (the pipeline would pick another)."""
    from hypothesis import assume
    from hypothesis import strategies as st

    from cutlass_offload.emit import conv_sm90
    from cutlass_offload.ir import replace
    kern = proto.kernel
    padded = proto.region.problem.pad_c > 0      # a C % 8 class on sm90a: C zero-padded to 8s
    if padded:                                   # (select.conv.pad_channels: C < 64, C % 8)
        c = data.draw(st.integers(1, 63).filter(lambda v: v % 8), label=f"{name} C")
    else:
        c = kern.align_a * data.draw(st.integers(1, 64 // kern.align_a), label=f"{name} C/align")
    k = kern.align_c * data.draw(st.integers(1, 96 // kern.align_c), label=f"{name} K/align")
    n, h, w = (data.draw(st.integers(1, hi)) for hi in (3, 19, 23))
    if kern.iterator == "direct":                # the activation is the GEMM's A: 1x1 only
        r = s = 1
        pad, stride, dilation = (0, 0, 0, 0), (1, 1), (1, 1)
    else:                                        # im2col takes any geometry, like the others
        r, s = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5))
        pad = tuple(data.draw(st.integers(0, 3)) for _ in range(4))
        stride = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
        dilation = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
    try:
        problem = replace(proto.region.problem, c=c, k=k, h=h, w=w, r=r, s=s, pad=pad,
                          stride=stride, dilation=dilation, n=n, n_hint=n,
                          pad_c=-c % 8 if padded else 0)
    except ValueError:           # empty output
        assume(False)
    if kern.config.family == "cutlass3x_sm90" and not kern.iterator:
        assume(conv_sm90.supports(problem))
    return problem, pad, stride, dilation


def check_conv_call(mod, what, x, wt, b, res, k, reference):
    """Run the conv region module ``mod`` on NHWC ``x``, filter ``wt``, bias ``b`` and a
    fresh residual of kind ``res`` ("none", "full_add": (N, K, P, Q), "channel_mul":
    (1, K, 1, 1), "sample_add" / "sample_mul": (N, K, 1, 1)), outputs poisoned first,
    against ``reference(x, w, b, r)`` in float32
    (within TOLERANCE of x's dtype); the call must map onto the kernel. ``what`` names
    the case in a failure."""
    p, q = mod.region.problem.p, mod.region.problem.q
    n, dt = x.shape[0], x.dtype
    rr = {"none": None, "full_add": torch.randn(n, k, p, q, device="cuda"),
          "channel_mul": torch.randn(1, k, 1, 1, device="cuda"),
          "sample_add": torch.randn(n, k, 1, 1, device="cuda"),
          "sample_mul": torch.randn(n, k, 1, 1, device="cuda")}[res]
    xs = (x, wt, b) + ((rr.to(dt).contiguous(memory_format=torch.channels_last),) if rr is not None else ())
    assert mod._map(xs) is not None, f"{what} does not map onto {mod.kernel.name}"
    poison_allocator()
    with torch.no_grad():
        out = mod(*xs)
    torch.cuda.synchronize()
    ref = reference(x.float(), wt.float(), b.float(), xs[3].float() if rr is not None else None)
    assert out.shape == ref.shape and not out.isnan().any(), f"{what}: unwritten output"
    err = rel_err(out, ref)
    assert err < TOLERANCE[dt], f"{what}: rel. error {err:.2e}"


def property_settings():
    """hypothesis settings of the GPU property tests: a derandomized 25 examples, or
    CUTLASS_OFFLOAD_PROPERTY_EXAMPLES random ones."""
    import os

    from hypothesis import HealthCheck, settings
    deep = int(os.environ.get("CUTLASS_OFFLOAD_PROPERTY_EXAMPLES", "0"))
    return settings(max_examples=deep or 25, derandomize=not deep, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@contextlib.contextmanager
def gemm_table(path, m: int, k: int, configs, gpu: str | None = None, num_sms: int | None = None):
    """Make ``select.sm90`` read a learned table of one entry per (n, KernelConfig) of
    ``configs`` for (m, n, k) problems, written to ``path`` for ``gpu`` with
    ``num_sms`` SMs (default: the current CUDA device's name and SM count), until the
    block ends; then the table before."""
    from cutlass_offload.ir import config_to_dict
    from cutlass_offload.select import sm90
    entries = [{"m": m, "n": n, "k": k, "batch": 1, "layout_b": "col",
                "config": config_to_dict(cfg), "launch": {}} for n, cfg in configs]
    path.write_text(json.dumps({
        "gpu": gpu if gpu is not None else torch.cuda.get_device_name(0),
        "num_sms": num_sms if num_sms is not None else torch.cuda.get_device_properties(0).multi_processor_count,
        "entries": entries}))
    before = sm90.TABLE_FILE
    sm90.use_table(path)
    try:
        yield
    finally:
        sm90.use_table(before)


class LMLogits(torch.nn.Module):
    """A transformers causal LM as a module of token ids returning its logits."""

    def __init__(self, lm):
        super().__init__()
        self.m = lm.eval()

    def forward(self, ids):
        return self.m(ids).logits


def compile_and_check_lm(lm, vocab: int, check_plan, seq: int = 128, batch: int = 2):
    """Compile the fp16 copy of transformers causal LM ``lm`` (on CUDA, random init) on
    random token ids for sm_90a with eager glue, call ``check_plan(compiled)`` (the test's assertions
    on its regions), then compare its logits on two fresh id sets, allocator poisoned,
    with the float32 model's (norm-wise TOLERANCE), and check every region ran its
    kernel. Returns the compiled model."""
    ref = LMLogits(lm).cuda().float()
    model = copy.deepcopy(ref).half()

    def ids(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return torch.randint(0, vocab, (batch, seq), device="cuda", generator=g)

    import cutlass_offload as co
    m = co.compile(model, (ids(0),), arch="sm_90a", glue="eager")
    check_plan(m)
    for seed in (1, 2):
        x = ids(seed)
        poison_allocator()
        with torch.no_grad():
            out, want = m(x), ref(x)
        torch.cuda.synchronize()
        assert not out.isnan().any()
        assert rel_err(out, want) < TOLERANCE[torch.float16]
    assert_regions_ran(m)
    return m


def assert_regions_ran(compiled):
    """Every region of ``compiled`` was called and ran its kernel (no PyTorch fallback)."""
    calls = [(mod.calls, mod.fallback_calls) for mod in compiled.region_modules()]
    assert calls and all(c > 0 and f == 0 for c, f in calls), calls
