"""Mapping call arguments onto a kernel (no GPU: CPU tensors, no launch): calls that
do not fit the kernel are refused (the region then runs PyTorch), never mis-mapped."""
import pytest
import torch

from cutlass_offload.capture import capture
from cutlass_offload.partition import partition
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.select import select


def region_module(fn, *inputs):
    class M(torch.nn.Module):
        def forward(self, *xs):
            return fn(*xs)
    cap = capture(M(), inputs)
    plan = select(partition(cap.graph_module), "sm90a")
    gm = offload(cap.graph_module, plan, library_path=None)
    (mod,) = [m for m in gm.modules() if type(m).__name__ == "GemmRegionModule"]
    return mod


H = torch.float16


def test_fitting_call_maps_with_strides_and_sizes():
    mod = region_module(lambda x, w, b: torch.relu(torch.nn.functional.linear(x, w, b)),
                        torch.randn(4, 6, 64, dtype=H), torch.randn(32, 64, dtype=H), torch.randn(32, dtype=H))
    x, w, b = torch.randn(5, 6, 64, dtype=H), torch.randn(32, 64, dtype=H), torch.randn(32, dtype=H)
    out, args, keep = mod._map((x, w, b))
    assert out.shape == (5, 6, 32) and out.dtype == H
    assert (args.m, args.n, args.k, args.l) == (30, 32, 64, 1)
    assert (args.lda, args.ldb, args.ldd) == (64, 64, 32)
    assert args.a == x.data_ptr() and args.b == w.data_ptr() and args.bias == b.data_ptr()


@pytest.mark.parametrize("bad", ["dtype", "k", "n", "misaligned", "bias_dtype"])
def test_call_that_does_not_fit_is_refused(bad):
    mod = region_module(lambda x, w, b: torch.nn.functional.linear(x, w, b),
                        torch.randn(8, 64, dtype=H), torch.randn(32, 64, dtype=H), torch.randn(32, dtype=H))
    x, w, b = torch.randn(8, 64, dtype=H), torch.randn(32, 64, dtype=H), torch.randn(32, dtype=H)
    if bad == "dtype":
        x, w = x.float(), w.float()
    elif bad == "k":
        x, w = torch.randn(8, 48, dtype=H), torch.randn(32, 48, dtype=H)
    elif bad == "n":
        w, b = torch.randn(40, 64, dtype=H), torch.randn(40, dtype=H)
    elif bad == "misaligned":
        x = torch.randn(8 * 64 + 1, dtype=H)[1:].view(8, 64)
    else:
        b = b.float()
    assert mod._map((x, w, b)) is None


def test_non_contiguous_input_is_copied_not_misread():
    mod = region_module(lambda x, w: x @ w, torch.randn(16, 64, dtype=H), torch.randn(64, 32, dtype=H))
    x = torch.randn(64, 16, dtype=H).t()            # (16, 64), K not contiguous
    out, args, keep = mod._map((x, torch.randn(64, 32, dtype=H)))
    a3 = keep[0]
    assert a3.is_contiguous() and torch.equal(a3[0], x) and args.a == a3.data_ptr()


def test_every_conformance_case_maps_onto_its_kernel():
    """Guards against silent fallbacks: each case's fresh inputs fit its kernel."""
    from gemm_cases import SuiteModel, conformance_cases, example_dims, suite_dynamic_shapes, suite_inputs
    cases = conformance_cases()
    cap = capture(SuiteModel(cases), suite_inputs(cases, example_dims(cases), H),
                  dynamic_shapes=suite_dynamic_shapes(cases))
    plan = select(partition(cap.graph_module), "sm90a")
    gm = offload(cap.graph_module, plan, library_path=None)
    mods = {name: m for name, m in gm.named_children() if type(m).__name__ == "GemmRegionModule"}
    calls = {}

    def recording(name, m):
        def forward(*args):            # map the call as on the GPU, then run PyTorch
            calls[name] = m._map(args)
            return m.fallback(*args)
        return forward
    for name, m in mods.items():
        m.forward = recording(name, m)
    with torch.no_grad():
        gm(*suite_inputs(cases, example_dims(cases, 23), H))
    assert len(calls) == len(cases)
    refused = [n for n, c in calls.items() if c is None]
    assert not refused, refused


FIELDS = ("m", "n", "k", "l", "lda", "ldb", "ldc", "ldd", "batch_stride_a", "batch_stride_b",
          "batch_stride_c", "batch_stride_d", "a", "b", "bias", "c")


def test_repeat_calls_map_exactly_like_the_first():
    """The cached per-signature path sets the same arguments as the general one,
    on fresh tensors (new pointers) of every conformance case."""
    from gemm_cases import SuiteModel, conformance_cases, example_dims, suite_dynamic_shapes, suite_inputs
    cases = conformance_cases()
    cap = capture(SuiteModel(cases), suite_inputs(cases, example_dims(cases), H),
                  dynamic_shapes=suite_dynamic_shapes(cases))
    gm = offload(cap.graph_module, select(partition(cap.graph_module), "sm90a"), library_path=None)
    mods = {name: m for name, m in gm.named_children() if type(m).__name__ == "GemmRegionModule"}
    seen = {name: [] for name in mods}

    def recording(name, m):
        def fields(mapped, args):         # snapshot: the structs are reused
            if mapped is None:
                return None
            ptrs = {t.data_ptr() for t in args if isinstance(t, torch.Tensor)}
            # an operand copied per call (a partial batch broadcast) has a new address each time
            return (mapped[0], {f: ("copy" if f in ("a", "b") and getattr(mapped[1], f) not in ptrs
                                    else getattr(mapped[1], f)) for f in FIELDS})

        def forward(*args):
            general = fields(m._map_general(args), args)
            m._map(args)                   # fills the cache when no copy was needed
            again = fields(m._map(args), args)   # served from the cache
            seen[name].append((general, again))
            return m.fallback(*args)
        return forward
    for name, m in mods.items():
        m.forward = recording(name, m)
    with torch.no_grad():
        for value in (23, 31, 23):          # two signatures, then fresh tensors of the first
            gm(*suite_inputs(cases, example_dims(cases, value), H))
    direct = 0
    for name, calls in seen.items():
        for general, again in calls:
            assert general is not None and again is not None, name
            direct += bool(mods[name]._direct)
            assert general[1] == again[1], name
            assert general[0].shape == again[0].shape and again[0].dtype == general[0].dtype
    assert direct > len(cases)              # most calls take the cached path


def emulate_gemm(mod, args, keep, xs):
    """The GEMM the kernel would compute from ``args`` (no epilogue), in float32: each
    operand read from the tensor (among ``keep`` and ``xs``) whose data pointer the
    args hold, through the args' strides, as the kernel reads memory."""
    def at(ptr):
        return next(t for t in list(keep) + list(xs) if isinstance(t, torch.Tensor) and t.data_ptr() == ptr)
    l, m, n, k = args.l, args.m, args.n, args.k
    a_t, b_t = at(args.a), at(args.b)
    a_strides = (args.batch_stride_a, 1, args.lda) if mod.kernel.layout_a == "col" else \
        (args.batch_stride_a, args.lda, 1)
    a = a_t.as_strided((l, m, k), a_strides, a_t.storage_offset())
    b_strides = (args.batch_stride_b, 1, args.ldb) if mod.kernel.layout_b == "col" else \
        (args.batch_stride_b, args.ldb, 1)
    b = b_t.as_strided((l, k, n), b_strides, b_t.storage_offset())
    return a.float() @ b.float()


@pytest.mark.parametrize("xa,wb", [((5, 1, 32, 8), (5, 3, 8, 16)), ((3, 1, 1, 16, 16), (2, 1, 16, 24)),
                                    ((2, 4, 8, 16), (1, 4, 16, 8))])
def test_partial_batch_broadcast_maps_onto_expanded_operands(xa, wb):
    """(5, 1) x (5, 3) batches: one batch stride per operand cannot repeat A within a
    group, so both are expanded to the broadcast batch; the kernel's view of memory
    then computes torch.matmul's product (float32 emulation from the args)."""
    def fn(x, w):
        return x @ w
    x, w = torch.randn(*xa, dtype=H), torch.randn(*wb, dtype=H)
    mod = region_module(fn, x, w)
    assert mod.region.batch_mode == "expand"
    x, w = torch.randn(*xa, dtype=H), torch.randn(*wb, dtype=H)           # fresh values
    out, args, keep = mod._map((x, w))
    want = torch.matmul(x.float(), w.float())
    assert out.shape == want.shape and args.l == want.shape[:-2].numel()
    got = emulate_gemm(mod, args, keep, (x, w)).reshape(want.shape)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 64, 48), (2, 3, 64, 48), (64, 48)])
def test_linear_on_a_transposed_view_reads_a_column_major_in_place(shape):
    """A Linear on ``x.transpose(-1, -2)`` (the VAE's attention projections): A is
    M-contiguous, read in place by a column-major-A kernel, one batch entry per
    leading index sharing the weight (B broadcast); the kernel's view of memory
    computes F.linear's product (float32 emulation from the args)."""
    def fn(x, w):
        return torch.nn.functional.linear(x.transpose(-1, -2), w)
    w = torch.randn(40, shape[-2], dtype=H)
    mod = region_module(fn, torch.randn(*shape, dtype=H), w)
    assert mod.region.problem.layout_a == "col" and mod.kernel.layout_a == "col"
    assert mod.region.batch_mode == ("b_broadcast" if len(shape) > 2 else "fold")
    assert any("column-major" in n for n in mod.region.notes)
    assert mod.region.problem.summary()["layout_a"] == "col"      # report.json shows it
    x = torch.randn(*shape, dtype=H).transpose(-1, -2)        # fresh values, the region's A
    out, args, keep = mod._map((x, w))
    want = torch.nn.functional.linear(x.float(), w.float())
    assert args.a == x.data_ptr() and args.lda == shape[-1] and out.shape == want.shape
    assert args.batch_stride_b == 0 and args.l == max(1, torch.Size(shape[:-2]).numel())
    got = emulate_gemm(mod, args, keep, (x, w)).reshape(want.shape)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op, xa, wb, mode", [
    ("mm", (48, 64), (48, 40), "fold"),                  # x.t() @ w, w (K, N) row-major
    ("mm_bt", (48, 64), (40, 48), "fold"),               # x.t() @ w.t(): both transposed views
    ("matmul", (2, 3, 48, 64), (48, 40), "b_broadcast"),  # B shared by every batch entry
    ("bmm", (3, 48, 64), (3, 48, 40), "batched"),
    ("matmul", (48, 64), (3, 48, 40), "a_broadcast"),
    ("matmul", (2, 1, 48, 64), (2, 3, 48, 40), "expand"),
])
def test_matmuls_on_a_transposed_view_read_a_column_major(op, xa, wb, mode):
    """mm / bmm / matmul whose A is ``x.transpose(-1, -2)`` run a column-major-A kernel
    (a fresh-user trial, session 53: they stayed in PyTorch, only a Linear did this),
    in every batch mode; the kernel's view of memory computes torch.matmul's product
    (float32 emulation from the args)."""
    def fn(x, w):
        a = x.transpose(-1, -2)
        if op == "mm":
            return torch.mm(a, w)
        if op == "mm_bt":
            return torch.mm(a, w.t())
        return torch.bmm(a, w) if op == "bmm" else torch.matmul(a, w)
    mod = region_module(fn, torch.randn(*xa, dtype=H), torch.randn(*wb, dtype=H))
    assert mod.region.problem.layout_a == "col" and mod.kernel.layout_a == "col"
    assert mod.region.batch_mode == mode
    assert mod.region.problem.layout_b == ("col" if op == "mm_bt" else "row")
    # fresh values, as the region's inputs (the views are the graph's, outside it)
    a = torch.randn(*xa, dtype=H).transpose(-1, -2)
    b = torch.randn(*wb, dtype=H)
    b = b.t() if op == "mm_bt" else b
    out, args, keep = mod._map((a, b))
    want = a.float() @ b.float()
    assert out.shape == want.shape
    if mode != "expand":
        assert args.a == a.data_ptr()                    # read in place
    got = emulate_gemm(mod, args, keep, (a, b)).reshape(want.shape)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fp32_matmul_on_a_transposed_view_stays_with_a_reason():
    from cutlass_offload.config import CompileOptions

    class M(torch.nn.Module):
        def forward(self, x, w):
            return x.t() @ w
    part = partition(capture(M(), (torch.randn(48, 64), torch.randn(48, 40))).graph_module,
                     CompileOptions(allow_tf32=True))
    assert not part.regions and "K-contiguous" in part.fallbacks[0].reason


def test_transposed_view_whose_batch_cannot_merge_is_copied_column_major():
    def fn(x, w):
        return torch.nn.functional.linear(x.transpose(-1, -2), w)
    w = torch.randn(40, 64, dtype=H)
    mod = region_module(fn, torch.randn(2, 3, 64, 48, dtype=H), w)
    x = torch.randn(3, 2, 64, 48, dtype=H).permute(1, 0, 3, 2)    # batch strides do not merge
    out, args, keep = mod._map((x, w))
    assert args.a != x.data_ptr() and keep[0].stride(-2) == 1   # a column-major copy
    got = emulate_gemm(mod, args, keep, (x, w)).reshape(out.shape)
    want = torch.nn.functional.linear(x.float(), w.float())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    odd = torch.randn(2, 3, 64, 44, dtype=H).transpose(-1, -2)  # M = 44: not a multiple of 8
    assert mod._map((odd, w)) is None
