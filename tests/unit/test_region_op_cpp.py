"""The region op's C++ kernel (csrc/fast_call.cpp ``install_region_op``) without a
GPU: installed for the CPU key of a test namespace's copy of the op, over CPU
tensors and a fake launcher. A call whose key is bound to a FastCall with a cached
signature must reach the launcher without entering Python; every other call (an
unbound key, ints, another signature, a disabled FastCall, a declined launch)
must reach the Python implementation with the same arguments, and its result
and errors must come back unchanged."""
import ctypes

import pytest
import torch
from fast_call_helpers import FakeLauncher, fast_call_module

from cutlass_offload.runtime.library import CO_CANNOT_IMPLEMENT, CoGemmArgs
from cutlass_offload.runtime.ops import op_name, schema

NS = "co_cpp_region_test"
H = torch.float16


def off(field):
    return getattr(CoGemmArgs, field).offset


class PythonImpl:
    """The Python implementation: records its calls, returns a marker tensor."""

    def __init__(self):
        self.calls = []
        self.error = None

    def __call__(self, tensors, ints, key):
        self.calls.append((list(tensors), list(ints), key))
        if self.error:
            raise self.error
        return torch.full((2, 2), 7.0)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    ext = fast_call_module()
    fake = FakeLauncher(tmp_path_factory.mktemp("fake_launcher"))
    lib = torch.library.Library(NS, "DEF")
    py = PythonImpl()
    ops = {}
    for arity in [(3, 0), (3, 1), (3, 2)]:
        lib.define(schema(*arity))
        assert ext.install_region_op(py, namespace=NS, dispatch_key="CPU", name=op_name(*arity))
        assert not ext.install_region_op(py, namespace=NS, dispatch_key="CPU",
                                         name=op_name(*arity))       # once per pair
        ops[arity] = getattr(getattr(torch.ops, NS), op_name(*arity)).default

    def op(tensors, ints, key):
        return ops[(len(tensors), len(ints))](*tensors, *ints, key)
    yield ext, fake, py, op
    del lib


def gemm_fast_call(ext, fake):
    fc = ext.FastCall(fake.address, ctypes.sizeof(CoGemmArgs), 3,
                      [(0, off("a"), 16), (1, off("b"), 16), (2, off("bias"), 16)],
                      off("d"), 16, off("workspace"), off("workspace_bytes"))
    xs = (torch.randn(8, 64, dtype=H), torch.randn(64, 32, dtype=H), torch.randn(32, dtype=H))
    assert fc.add(xs, bytes(CoGemmArgs(m=8, n=32, k=64, l=1, lda=64, ldb=32, ldd=32)),
                  torch.empty(8, 32, dtype=H), 0)
    return fc


def fresh():
    return [torch.randn(8, 64, dtype=H), torch.randn(64, 32, dtype=H), torch.randn(32, dtype=H)]


def test_bound_key_replays_in_cpp(env):
    ext, fake, py, op = env
    fc = gemm_fast_call(ext, fake)
    ext.bind(101, fc)
    try:
        assert ext.is_bound(101)
        before, n_py = fake.count, len(py.calls)
        ys = fresh()
        out = op(ys, [], 101)
        sent = fake.last_args(CoGemmArgs)
        assert (sent.a, sent.b, sent.bias) == tuple(y.data_ptr() for y in ys)
        assert sent.d == out.data_ptr() and out.shape == (8, 32) and out.dtype == H
        assert fake.count == before + 1 and fc.calls == 1 and len(py.calls) == n_py
    finally:
        ext.unbind(101)
    assert not ext.is_bound(101)


@pytest.mark.parametrize("why", ["unbound", "ints", "signature", "disabled", "declined"])
def test_everything_else_goes_to_python(env, why):
    ext, fake, py, op = env
    fc = gemm_fast_call(ext, fake)
    key = 200 + ["unbound", "ints", "signature", "disabled", "declined"].index(why)
    if why != "unbound":
        ext.bind(key, fc)
    ys, ints = fresh(), []
    if why == "ints":
        ints = [3, 5]
    elif why == "signature":
        ys[0] = torch.randn(9, 64, dtype=H)
    elif why == "disabled":
        fc.enabled = False
    elif why == "declined":
        fake.set_status(CO_CANNOT_IMPLEMENT)
    try:
        n_py = len(py.calls)
        out = op(ys, ints, key)
    finally:
        fake.set_status(0)
        ext.unbind(key)
    assert torch.equal(out, torch.full((2, 2), 7.0))
    assert len(py.calls) == n_py + 1 and fc.calls == 0
    tensors, got_ints, got_key = py.calls[-1]
    assert got_key == key and got_ints == ints
    assert [t.data_ptr() for t in tensors] == [y.data_ptr() for y in ys]


def test_bound_order_maps_tensors_and_ints(env):
    """A key bound with an input order (a region with int inputs) replays in C++
    when its ints are the cached ones, and goes to Python with any other ints."""
    ext, fake, py, op = env
    fc = ext.FastCall(fake.address, ctypes.sizeof(CoGemmArgs), 4,
                      [(0, off("a"), 16), (2, off("b"), 16), (3, off("bias"), 16)],
                      off("d"), 16, off("workspace"), off("workspace_bytes"), int_inputs=[1])
    a, b, bias = fresh()
    assert fc.add((a, 128, b, bias), bytes(CoGemmArgs(m=8, n=32, k=64, l=1)), torch.empty(8, 32, dtype=H), 0)
    # region inputs (a, L, b, bias) <- op tensors [a, b, bias] and ints [L]
    ext.bind(300, fc, [(True, 0), (False, 0), (True, 1), (True, 2)])
    try:
        ys, n_py = fresh(), len(py.calls)
        out = op(ys, [128], 300)
        sent = fake.last_args(CoGemmArgs)
        assert (sent.a, sent.b, sent.bias, sent.d) == tuple(y.data_ptr() for y in ys) + (out.data_ptr(),)
        assert fc.calls == 1 and len(py.calls) == n_py
        for ints in ([127], [], [128, 1]):
            out = op(fresh(), ints, 300)
            assert torch.equal(out, torch.full((2, 2), 7.0)) and py.calls[-1][1] == ints
        assert fc.calls == 1 and len(py.calls) == n_py + 3
    finally:
        ext.unbind(300)


def test_python_errors_come_back(env):
    ext, fake, py, op = env
    py.error = ValueError("region refused: test")
    try:
        with pytest.raises(ValueError, match="region refused: test"):
            op(fresh(), [], 400)
    finally:
        py.error = None


def test_region_module_binds_its_keys_once_it_has_a_fast_call(env):
    """ops.register / bind_fast: a plain region's key is bound when its FastCall
    exists, unbound when its entry dies; verify / disabled switch the replay off."""
    import gc

    from cutlass_offload.runtime import ops

    ext, fake, _, _ = env

    class Mod:
        def __init__(self):
            self._fast, self._op_keys = None, {}

    m = Mod()
    saved = ops._op_state["cpp"]
    ops._op_state["cpp"] = ext
    try:
        entry = ops.RegionEntry(m, None, "k_module")
        assert entry.cpp and entry.id == ops.key_id("k_module")
        m._op_keys[entry.id] = []
        ops.bind_fast(m)                          # no FastCall yet: nothing bound
        assert not ext.is_bound(entry.id)
        m._fast = gemm_fast_call(ext, fake)
        ops.bind_fast(m)
        assert ext.is_bound(entry.id)
        ops._forget(m, entry.id)
        assert not ext.is_bound(entry.id) and m._op_keys == {}
        del entry
        gc.collect()
    finally:
        ops._op_state["cpp"] = saved


def linear_module(fake, verify=False):
    """A linear region module over the fake launcher whose first signature has been
    offered to the C++ path (so it has its FastCall)."""
    import torch.nn.functional as F
    from test_fast_call import region_modules

    def inputs():
        return (torch.randn(8, 64, dtype=H), torch.randn(32, 64, dtype=H), torch.randn(32, dtype=H))
    _, mods = region_modules(lambda x, w, b: F.linear(x, w, b), inputs())
    (mod,) = mods.values()
    mod._fn, mod._ws, mod._ws_need = fake.fn, None, 0
    mod.verify = verify
    xs = inputs()
    out, args, _ = mod._map(xs)
    mod._fast_offer(xs, args, out)
    return mod


def test_verify_and_disabled_switch_the_replay_off(env):
    """A region module's FastCall follows its verify / disabled state (the op's C++
    kernel calls the FastCall without asking the module)."""
    mod = linear_module(env[1], verify=True)      # verify set before the FastCall exists
    assert mod._fast is not None and not mod._fast.enabled
    mod.verify = False
    assert mod._fast.enabled
    mod.disabled = "verification failed: test"
    assert not mod._fast.enabled and mod.disabled == "verification failed: test"
    mod.disabled = None
    assert mod._fast.enabled


def test_forward_hooks_switch_the_replay_off_until_removed(env):
    """A hooked region module must be called (the C++ kernel would skip its hooks);
    once the hooks are gone, the next Python-path call lets the replay resume."""
    mod = linear_module(env[1])
    assert mod._fast.enabled
    seen = []
    h = mod.register_forward_hook(lambda m, i, o: seen.append(o))
    pre = mod.register_forward_pre_hook(lambda m, i: None)
    assert not mod._fast.enabled
    h.remove()
    pre.remove()
    assert not mod._fast.enabled          # removal is noticed by the next call
    mod._sync_fast()
    assert mod._fast.enabled
