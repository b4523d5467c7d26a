"""The C++ call path (runtime/csrc/fast_call.cpp) without a GPU: CPU tensors and a
fake launcher that records what it is handed. A replayed call must hand the
launcher exactly the args the Python mapping builds, with this call's pointers;
anything it cannot vouch for (another signature, a misaligned pointer, a small
workspace, a status other than ok) must come back as None for the Python path."""
import ctypes

import pytest
import torch
import torch.nn.functional as F
from fast_call_helpers import FakeLauncher, fast_call_module, replay_matches_python
from helpers import Fn, recorded_calls

from cutlass_offload.capture import capture
from cutlass_offload.partition import partition
from cutlass_offload.runtime import fast_call
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.runtime.library import CO_CANNOT_IMPLEMENT, CoGemmArgs
from cutlass_offload.runtime.region import RegionModule
from cutlass_offload.select import select

H = torch.float16


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    return FakeLauncher(tmp_path_factory.mktemp("fake_launcher"))


def off(field):
    return getattr(CoGemmArgs, field).offset


def gemm_fast_call(fake, workspace_need=0, out=None):
    """A FastCall over (a, b, bias) with one cached signature: a (8, 64), b (64, 32), bias (32,)."""
    module = fast_call_module()
    fc = module.FastCall(fake.address, ctypes.sizeof(CoGemmArgs), 3,
                         [(0, off("a"), 16), (1, off("b"), 16), (2, off("bias"), 16)],
                         off("d"), 16, off("workspace"), off("workspace_bytes"))
    xs = (torch.randn(8, 64, dtype=H), torch.randn(64, 32, dtype=H), torch.randn(32, dtype=H))
    args = CoGemmArgs(m=8, n=32, k=64, l=1, lda=64, ldb=32, ldd=32)
    out = torch.empty(8, 32, dtype=H) if out is None else out
    assert fc.add(xs, bytes(args), out, workspace_need)
    return fc, args


def fresh():
    return (torch.randn(8, 64, dtype=H), torch.randn(64, 32, dtype=H), torch.randn(32, dtype=H))


def test_replay_patches_this_calls_pointers_into_the_cached_args(fake):
    fc, _ = gemm_fast_call(fake)
    for _ in range(3):
        ys = fresh()
        out = fc(ys)
        sent = fake.last_args(CoGemmArgs)
        assert (sent.a, sent.b, sent.bias) == tuple(y.data_ptr() for y in ys)
        assert sent.d == out.data_ptr() and sent.c is None
        assert (sent.m, sent.n, sent.k, sent.l, sent.lda, sent.ldb, sent.ldd) == (8, 32, 64, 1, 64, 32, 32)
        assert (sent.workspace, sent.workspace_bytes) == (None, 0)
        assert out.shape == (8, 32) and out.dtype == H and out.is_contiguous()
    assert fc.calls == 3 and fc.entries == 1


def test_output_layout_is_the_cached_one(fake):
    # e.g. a conv region's NHWC buffer returned as a channels_last NCHW view
    nhwc = torch.empty(2, 4, 4, 8, dtype=H)
    fc, _ = gemm_fast_call(fake, out=nhwc.permute(0, 3, 1, 2))
    out = fc(fresh())
    assert out.shape == (2, 8, 4, 4) and out.stride() == nhwc.permute(0, 3, 1, 2).stride()
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("change", ["shape", "stride", "dtype", "count", "not_a_tensor"])
def test_other_signature_is_declined(fake, change):
    fc, _ = gemm_fast_call(fake)
    a, b, bias = fresh()
    if change == "shape":
        ys = (torch.randn(9, 64, dtype=H), b, bias)
    elif change == "stride":
        ys = (torch.randn(64, 8, dtype=H).t(), b, bias)
    elif change == "dtype":
        ys = (a.float(), b, bias)
    elif change == "count":
        ys = (a, b)
    else:
        ys = (a, b, 1.0)
    before = fake.count
    assert fc(ys) is None and fake.count == before and fc.calls == 0


def test_guards_and_ints_are_part_of_the_signature(fake):
    """A guard input (metadata checked, pointer never sent) and the region's int
    inputs key the cached signature: another guard shape or int value is declined,
    the cached ones replay with only the operands' pointers patched."""
    module = fast_call_module()
    fc = module.FastCall(fake.address, ctypes.sizeof(CoGemmArgs), 5,
                         [(0, off("a"), 16), (1, off("b"), 16), (2, off("bias"), 16)],
                         off("d"), 16, off("workspace"), off("workspace_bytes"),
                         guards=[3], int_inputs=[4])
    args = CoGemmArgs(m=8, n=32, k=64, l=1, lda=64, ldb=32, ldd=32)
    mask = torch.ones(8, 8, dtype=torch.bool)
    assert fc.add(fresh() + (mask, 8), bytes(args), torch.empty(8, 32, dtype=H), 0)
    before = fake.count
    ys = fresh()
    out = fc(ys + (torch.zeros(8, 8, dtype=torch.bool), 8))      # guard's values are not read
    assert out is not None and fake.count == before + 1
    sent = fake.last_args(CoGemmArgs)
    assert (sent.a, sent.b, sent.bias, sent.d) == tuple(y.data_ptr() for y in ys) + (out.data_ptr(),)
    declined = [fresh() + (torch.ones(8, 9, dtype=torch.bool), 8),      # guard shape
                fresh() + (torch.ones(8, 16, dtype=torch.bool)[:, ::2], 8),   # guard strides
                fresh() + (mask.half(), 8),                          # guard dtype
                fresh() + (mask, 9),                                 # int value
                fresh() + (mask, 8.0),                               # not an int
                fresh() + (mask, True),                              # a bool is not an int
                fresh() + (8, mask)]                                 # kinds swapped
    for ys in declined:
        assert fc(ys) is None
    assert fake.count == before + 1 and fc.calls == 1
    with pytest.raises(ValueError, match="bad guard"):
        module.FastCall(fake.address, ctypes.sizeof(CoGemmArgs), 3, [(0, off("a"), 16)], off("d"), 16,
                        off("workspace"), off("workspace_bytes"), guards=[3])
    with pytest.raises(ValueError, match="int input is not an int"):
        fc.add(fresh() + (mask, mask), bytes(args), torch.empty(8, 32, dtype=H), 0)


def test_misaligned_operand_is_declined(fake):
    fc, _ = gemm_fast_call(fake)
    a, b, bias = fresh()
    odd = torch.randn(8 * 64 + 1, dtype=H)[1:].view(8, 64)      # same sizes / strides, 2 bytes off
    assert odd.stride() == a.stride() and odd.data_ptr() % 16 == 2
    assert fc((odd, b, bias)) is None


def test_workspace_too_small_is_declined_then_used(fake):
    fc, _ = gemm_fast_call(fake, workspace_need=256)
    assert fc(fresh()) is None                                    # none set yet
    fc.set_workspace(torch.empty(128, dtype=torch.uint8))
    assert fc(fresh()) is None                                    # too small
    ws = torch.empty(512, dtype=torch.uint8)
    fc.set_workspace(ws)
    assert fc(fresh()) is not None
    sent = fake.last_args(CoGemmArgs)
    assert (sent.workspace, sent.workspace_bytes) == (ws.data_ptr(), 512)


def test_status_other_than_ok_is_declined(fake):
    fc, _ = gemm_fast_call(fake)
    fake.set_status(CO_CANNOT_IMPLEMENT)
    try:
        assert fc(fresh()) is None and fc.last_status == CO_CANNOT_IMPLEMENT and fc.calls == 0
    finally:
        fake.set_status(0)
    assert fc(fresh()) is not None and fc.calls == 1


def test_bad_construction_raises(fake):
    module = fast_call_module()
    size = ctypes.sizeof(CoGemmArgs)
    with pytest.raises(ValueError, match="outside the args"):
        module.FastCall(fake.address, size, 3, [(0, size, 16)], off("d"), 16, off("workspace"),
                        off("workspace_bytes"))
    with pytest.raises(ValueError, match="null launcher"):
        module.FastCall(0, size, 3, [(0, 0, 16)], off("d"), 16, off("workspace"), off("workspace_bytes"))
    with pytest.raises(ValueError, match="bad operand"):
        module.FastCall(fake.address, size, 3, [(3, 0, 16)], off("d"), 16, off("workspace"),
                        off("workspace_bytes"))
    fc, args = gemm_fast_call(fake)
    assert not fc.add(fresh(), bytes(args), torch.empty(8, 64, dtype=H)[:, :32], 0)   # not dense
    with pytest.raises(ValueError, match="another size"):
        fc.add(fresh(), bytes(args)[:-8], torch.empty(8, 32, dtype=H), 0)


def test_failed_build_keeps_the_log_and_publishes_nothing(tmp_path, monkeypatch):
    broken = tmp_path / "broken.cpp"
    broken.write_text("#include <Python.h>\nthis is not C++;\n")
    monkeypatch.setattr(fast_call, "SOURCE", broken)
    root = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="compiler output in"):
        fast_call.build(root)
    logs = list(root.glob("*.log"))
    assert len(logs) == 1 and "error" in logs[0].read_text()
    assert [p for p in root.iterdir() if p.is_dir()] == []       # no half-built folder


def test_a_damaged_cached_extension_is_built_again_not_imported(tmp_path, monkeypatch):
    """A truncated extension in the cache would kill the process with SIGBUS when
    imported: it is detected (ELF check), named in a warning and rebuilt."""
    stub = tmp_path / "stub.cpp"
    stub.write_text('extern "C" int co_stub() { return 1; }\n')
    monkeypatch.setattr(fast_call, "build_command", lambda source, output, cxx=None: [
        "c++", "-shared", "-fPIC", str(stub), "-o", str(output)])
    root = tmp_path / "cache"
    path = fast_call.build(root)
    good = path.read_bytes()
    path.write_bytes(good[:len(good) // 2])
    with pytest.warns(RuntimeWarning, match=f"{path.name} is truncated.*building it again"):
        assert fast_call.build(root) == path
    assert path.read_bytes() == good


def test_disabled_by_the_environment(monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_FAST_CALL", "0")
    monkeypatch.setattr(fast_call, "_state", {"module": None, "error": None, "thread": None})
    assert fast_call.load(block=True) is None and fast_call.error() is None


# -- region modules: the C++ replay hands the launcher what the Python mapping would --

def region_modules(fn, xs, arch="sm90a", dynamic_shapes=None):
    cap = capture(Fn(fn), xs, dynamic_shapes=dynamic_shapes)
    gm = offload(cap.graph_module, select(partition(cap.graph_module), arch), library_path=None)
    return gm, {n: m for n, m in gm.named_children() if isinstance(m, RegionModule)}


def test_gemm_suite_replays_like_python(fake):
    from gemm_cases import (
        SuiteModel,
        conformance_cases,
        example_dims,
        suite_dynamic_shapes,
        suite_inputs,
    )
    cases = conformance_cases()
    cap = capture(SuiteModel(cases), suite_inputs(cases, example_dims(cases), H),
                  dynamic_shapes=suite_dynamic_shapes(cases))
    gm = offload(cap.graph_module, select(partition(cap.graph_module), "sm90a"), library_path=None)
    mods = {n: m for n, m in gm.named_children() if isinstance(m, RegionModule)}
    seen = recorded_calls(gm, mods, *(suite_inputs(cases, example_dims(cases, 23), H) for _ in range(2)))
    replayed = {n for n, calls in seen.items() if replay_matches_python(mods[n], *calls, fake)}
    # every region whose operands are read in place; a partial batch broadcast copies one
    copying = {n for n, m in mods.items() if m.region.batch_mode == "expand"}
    assert len(mods) == len(cases) and copying and replayed == set(mods) - copying, (replayed, copying)


def test_conv_suite_replays_like_python(fake):
    from conv_cases import SuiteModel, conformance_cases, suite_inputs
    cases = conformance_cases()
    model = SuiteModel(cases, H)
    cap = capture(model, suite_inputs(cases, H))
    gm = offload(cap.graph_module, select(partition(cap.graph_module), "sm90a"), library_path=None)
    mods = {n: m for n, m in gm.named_children() if isinstance(m, RegionModule)}
    seen = recorded_calls(gm, mods, suite_inputs(cases, H, seed=1), suite_inputs(cases, H, seed=2))
    replayed = sum(replay_matches_python(mods[n], *calls, fake) for n, calls in seen.items())
    assert replayed == len(mods), (replayed, len(mods))


def test_norm_regions_replay_like_python(fake):
    def fn(x, w, b, y, g, h):
        ln = F.layer_norm(x, (64,), w, b, 1e-12)
        rms = F.rms_norm(x, (64,), w, 1e-6)
        gn = F.silu(F.group_norm(y, 8, g, h, 1e-6))
        return ln, rms, gn

    def inputs():
        return (torch.randn(3, 5, 64, dtype=H), torch.randn(64, dtype=H), torch.randn(64, dtype=H),
                torch.randn(2, 64, 8, 8, dtype=H).contiguous(memory_format=torch.channels_last),
                torch.randn(64, dtype=H), torch.randn(64, dtype=H))
    gm, mods = region_modules(fn, inputs())
    assert len(mods) == 3
    seen = recorded_calls(gm, mods, inputs(), inputs())
    assert all(replay_matches_python(mods[n], *calls, fake) for n, calls in seen.items())


def test_attention_suite_replays_like_python(fake):
    from attention_cases import SuiteModel, conformance_cases, extra_cases, suite_inputs
    cases = conformance_cases() + extra_cases()
    cap = capture(SuiteModel(cases), suite_inputs(cases))
    gm = offload(cap.graph_module, select(partition(cap.graph_module), "sm90a"), library_path=None)
    mods = {n: m for n, m in gm.named_children() if isinstance(m, RegionModule)}
    seen = recorded_calls(gm, mods, suite_inputs(cases, seed=0), suite_inputs(cases, seed=7))
    replayed = 0
    for n, calls in seen.items():
        m = mods[n]
        got = replay_matches_python(m, *calls, fake)
        if m._ib is not None:
            assert not got, n              # a bias tensor keeps the Python path
        replayed += got
    assert replayed >= 20, (replayed, len(mods))       # 24 of 40 when written


def test_attention_with_a_checked_mask_replays_with_the_mask_as_a_guard(fake):
    """A causal mask folded at dynamic sizes (GPT-2's) is checked in Python once per
    shape; the C++ path replays the checked signatures with the mask's metadata as
    part of the key, and declines a mask of another shape."""
    from test_cached_region_mapping import cached_call, folded_mask_attention

    mod, n = folded_mask_attention("sm90a")
    assert mod._fast_guards() == (mod._im,)

    def call(seq, mask=None):
        xs = [None] * n
        for i in (mod._iq, mod._ik, mod._iv):
            xs[i] = torch.randn(2, 4, seq, 64, dtype=H)
        xs[mod._im] = torch.ones(seq, seq, dtype=torch.bool).tril() if mask is None else mask
        return tuple(xs)
    assert replay_matches_python(mod, call(16), call(16), fake)
    before = fake.count
    assert mod._fast(call(16, torch.ones(16, 17, dtype=torch.bool).tril())) is None   # guard shape
    assert mod._fast(call(20)) is None                    # not checked at this shape yet
    assert fake.count == before
    mod._mask_ok.clear()
    assert cached_call(mod, call(16, torch.ones(16, 16, dtype=torch.bool))) is None   # Python checks


def test_module_call_takes_the_cpp_path_and_keeps_hooks(fake):
    """mod(*xs) goes straight to the C++ path (no nn.Module call machinery) unless a
    forward hook is attached, which then still sees every call."""
    def inputs():
        return (torch.randn(8, 64, dtype=H), torch.randn(32, 64, dtype=H), torch.randn(32, dtype=H))
    gm, mods = region_modules(lambda x, w, b: F.linear(x, w, b), inputs())
    (mod,) = mods.values()
    assert replay_matches_python(mod, inputs(), inputs(), fake)
    before, calls = fake.count, mod.calls
    out = mod(*inputs())
    assert out.shape == (8, 32) and fake.count == before + 1 and mod.calls == calls + 1
    seen = []
    handle = mod.register_forward_pre_hook(lambda m, xs: seen.append(len(xs)))
    try:
        mod(*inputs())
    finally:
        handle.remove()
    assert seen == [3] and fake.count == before + 2 and mod.fallback_calls == 0
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, xs: seen.append(m))
    try:
        mod(*inputs())
    finally:
        handle.remove()
    assert seen[1:] == [mod] and fake.count == before + 3       # a global hook sees it too


def test_first_call_of_a_signature_offers_it(fake):
    """The call that stores a signature (read in place) offers it to the C++ path at
    once, so the second call of it is already replayed; a call whose operand was
    copied offers nothing."""
    fast_call_module()

    def inputs():
        return (torch.randn(8, 64, dtype=H), torch.randn(32, 64, dtype=H), torch.randn(32, dtype=H))
    gm, mods = region_modules(lambda x, w, b: F.linear(x, w, b), inputs())
    (mod,) = mods.values()
    mod._fn, mod._ws, mod._ws_need = fake.fn, None, 0
    x_t = torch.randn(64, 8, dtype=H).t()                  # K not contiguous: copied
    copied = (x_t,) + inputs()[1:]
    assert mod._map(copied) is not None and mod._fast_sig is None and not mod._direct
    xs = inputs()
    out, args, _ = mod._map(xs)
    assert mod._fast_sig is not None and len(mod._direct) == 1
    mod._fast_offer(xs, args, out)
    assert mod._fast.entries == 1
    before = fake.count
    assert mod._fast(inputs()) is not None and fake.count == before + 1


def test_calls_never_wait_for_a_background_build(monkeypatch):
    """While the extension builds in the background, prefetch() and load(block=False)
    (what a region call asks) return at once; the module appears once built."""
    import threading
    import time
    release = threading.Event()
    sentinel = object()

    def slow_build(root=None):
        release.wait(10)
        return "built"
    monkeypatch.setattr(fast_call, "_state", {"module": None, "error": None, "thread": None})
    monkeypatch.setattr(fast_call, "build", slow_build)
    monkeypatch.setattr(fast_call, "_import", lambda path: sentinel)
    monkeypatch.setenv("CUTLASS_OFFLOAD_FAST_CALL", "1")
    fast_call.prefetch()
    t0 = time.perf_counter()
    for _ in range(3):
        fast_call.prefetch()
        assert fast_call.load(block=False) is None
    assert time.perf_counter() - t0 < 1.0
    release.set()
    fast_call._state["thread"].join(10)
    assert fast_call.load(block=False) is sentinel and fast_call.load() is sentinel


def test_wait_joins_the_background_build_and_starts_none(monkeypatch):
    import threading

    from cutlass_offload.runtime import fast_call
    monkeypatch.setitem(fast_call._state, "thread", None)
    fast_call.wait()                                    # none started: returns at once
    assert fast_call._state["thread"] is None
    done = threading.Event()
    t = threading.Thread(target=lambda: (threading.Event().wait(0.2), done.set()))
    monkeypatch.setitem(fast_call._state, "thread", t)
    t.start()
    fast_call.wait()
    assert done.is_set()
