"""The region custom op (runtime/ops.py) without a GPU: schema, keys, the fake
impl's shapes and strides (static and symbolic) against what each region module
really allocates, and the real impl's layout / aliasing guarantees."""
import gc

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from cutlass_offload.runtime import ops
from glue_helpers import KINDS, five_kinds_inputs, kernel_like, offloaded
from helpers import recorded_calls


def _nonunit(shape, strides):
    return tuple(s for d, s in zip(shape, strides) if d != 1)


@pytest.fixture(scope="module")
def model():
    return offloaded()


@pytest.fixture(scope="module")
def calls(model):
    """{region name: its inputs in one forward}."""
    mods = {m.region.name: m for m in model.region_modules()}
    seen = recorded_calls(model.graph_module, mods, five_kinds_inputs())
    return {name: xs[0] for name, xs in seen.items()}


def test_schema_is_functional_and_asks_for_exact_strides():
    op = ops.region_op(2, 1)
    assert op is torch.ops.cutlass_offload.region_2t_1i.default
    schema = op._schema
    assert str(schema) == ("cutlass_offload::region_2t_1i(Tensor t0, Tensor t1, SymInt i0, int key)"
                           " -> Tensor")
    assert not schema.is_mutable
    assert all(a.alias_info is None for a in schema.arguments)
    assert schema.returns[0].alias_info is None
    assert torch.Tag.needs_exact_strides in op.tags
    assert ops.region_op(2, 1) is op                   # defined once per arity
    assert ops.region_op(3, 0) is torch.ops.cutlass_offload.region_3t_0i.default


@pytest.mark.parametrize("arity", [(1, 0), (3, 0), (2, 2), (7, 1)])
def test_cpp_wrapper_calls_the_op_without_python(arity):
    """Inductor's C++ wrapper calls an op straight through the dispatcher when its
    schema is StableIValue-only (tensors and ints); a Tensor[] or str argument sends
    each call back through Python under torch 2.11 (what the arity ops are for)."""
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    assert CppWrapperCpu._compatible_with_stableivalue(ops.region_op(*arity))
    for a in ops.region_op(*arity)._schema.arguments:
        assert not isinstance(a.type, (torch.ListType, torch.StringType))


def test_key_ids_are_int64_and_deterministic():
    assert ops.key_id("abc/linear_0") == ops.key_id("abc/linear_0")
    assert ops.key_id("abc/linear_0") != ops.key_id("abc/linear_0#1")
    assert all(0 <= ops.key_id(f"k{i}") < 2 ** 63 for i in range(100))


def test_every_kind_is_in_the_model(model):
    assert KINDS - {"addmm"} <= {r.form for r in model.plan.regions}
    layouts = {r.out_layout for r in model.plan.regions if r.form == "sdpa"}
    assert layouts == {"bmhk", "strided"}


def test_output_strides_are_what_each_module_allocates(model, calls):
    """The mapping a GPU call does (here on CPU tensors: no launch) allocates the
    output the kernel writes; output_strides must name exactly its layout."""
    checked = set()
    for m in model.region_modules():
        xs = calls[m.region.name]
        mapped = m._map(xs)
        assert mapped is not None, m.region.name
        out = m._launched(mapped[0], mapped[2])
        want = m.output_strides(tuple(out.shape))
        assert tuple(out.shape) == tuple(m.fallback(*xs).shape), m.region.name
        assert _nonunit(out.shape, out.stride()) == _nonunit(out.shape, want), m.region.name
        checked.add(type(m).__name__)
    assert checked == {"GemmRegionModule", "NormRegionModule", "AttentionRegionModule",
                       "ConvRegionModule", "GroupNormRegionModule"}


def test_fake_impl_gives_fallback_shape_and_module_strides(model, calls):
    entries = [ops.register(m, ["tensor"] * len(calls[m.region.name])) for m in model.region_modules()]
    mode = FakeTensorMode()
    for e in entries:
        xs = calls[e.module.region.name]
        ref = e.module.fallback(*xs)
        with mode:
            fake = ops.call(e, [mode.from_tensor(x) for x in xs])
        assert fake.shape == ref.shape and fake.dtype == ref.dtype
        assert fake.stride() == e.module.output_strides(tuple(ref.shape))


def test_fake_impl_with_symbolic_batch():
    model = offloaded(dynamic_batch=True)
    mods = {m.region.name: m for m in model.region_modules()}
    calls = {k: v[0] for k, v in recorded_calls(model.graph_module, mods, five_kinds_inputs(3)).items()}
    seen = 0
    for m in model.region_modules():
        xs = calls[m.region.name]
        if not all(isinstance(x, torch.Tensor) for x in xs):
            continue
        e = ops.register(m, ["tensor"] * len(xs))
        op = ops.region_op(len(xs), 0)
        gm = make_fx(lambda *ts, e=e: ops.call(e, ts), tracing_mode="symbolic")(*xs)
        node = next(n for n in gm.graph.nodes if n.target is op)
        assert node.args[-1] == e.id
        val = node.meta["val"]
        symbolic = [d for d in val.shape if isinstance(d, torch.SymInt) and not d.node.is_nested_int()
                    and d.node.expr.free_symbols]
        assert symbolic, (m.region.name, val.shape)
        assert tuple(val.stride()) == tuple(m.output_strides(tuple(val.shape)))
        seen += 1
    assert seen >= 5


def test_real_impl_restrides_a_fallback_result(model, calls, monkeypatch):
    m = next(m for m in model.region_modules() if m.region.form == "conv2d")
    xs = calls[m.region.name]
    e = ops.register(m, ["tensor"] * len(xs))

    def forward(*args):               # PyTorch's NCHW result, not the kernel's NHWC one
        m.fallback_calls += 1
        return m.fallback(*args).contiguous()
    monkeypatch.setattr(m, "forward", forward)
    out = ops.call(e, xs)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert out.stride() == m.output_strides(tuple(out.shape))
    torch.testing.assert_close(out, m.fallback(*xs))


def test_real_impl_never_returns_an_alias_of_an_input(model, calls, monkeypatch):
    m = next(m for m in model.region_modules() if m.region.form == "layer_norm")
    xs = calls[m.region.name]
    e = ops.register(m, ["tensor"] * len(xs))

    def forward(*args):               # a fallback that hands back its input
        m.fallback_calls += 1
        return args[0]
    monkeypatch.setattr(m, "forward", forward)
    out = ops.call(e, xs)
    assert out.untyped_storage().data_ptr() != xs[0].untyped_storage().data_ptr()
    torch.testing.assert_close(out, xs[0])


def test_real_impl_passes_a_kernel_result_through(model, calls, monkeypatch):
    m = next(m for m in model.region_modules() if m.region.form == "sdpa" and m.region.out_layout == "strided")
    xs = calls[m.region.name]
    e = ops.register(m, ["tensor"] * len(xs))
    got = []

    def forward(*args):
        got.append(kernel_like(m, m.fallback(*args)))
        return got[-1]
    monkeypatch.setattr(m, "forward", forward)
    out = ops.call(e, xs)
    assert out is got[0]                       # no copy on the kernel path


def test_keys_are_deterministic_and_never_shared(model):
    m = model.region_modules()[0]
    a = ops.register(m, ["tensor"])
    b = ops.register(m, ["tensor"])
    assert a.key != b.key and b.key.startswith(a.key.split("#")[0])
    again = offloaded()                      # another capture + offload of the same model
    m2 = next(x for x in again.region_modules() if x.region.name == m.region.name)
    assert ops.region_digest(m2) == ops.region_digest(m)
    other = next(x for x in model.region_modules() if x is not m)
    assert ops.region_digest(other) != ops.region_digest(m)
    assert a.id == ops.key_id(a.key) and b.id == ops.key_id(b.key) and a.id != b.id
    key, key_id = b.key, b.id
    assert ops.lookup(key_id) is b
    del b
    gc.collect()
    with pytest.raises(Exception, match="no region module is registered"):
        ops.lookup(key_id)
    c = ops.register(m, ["tensor"])
    assert c.key == key and c.id == key_id    # a freed key is taken again


def test_digest_changes_with_the_kernel(model):
    from dataclasses import replace
    m = next(x for x in model.region_modules() if x.region.form == "linear")
    before = ops.region_digest(m)
    kernel = m.kernel
    try:
        m.kernel = replace(kernel, align_a=1)
        assert ops.region_digest(m) != before
    finally:
        m.kernel = kernel


def test_input_kinds_and_mixed_inputs(model, calls):
    assert ops.input_kinds([torch.zeros(1), 3]) == ["tensor", "int"]
    assert ops.input_kinds([torch.zeros(1), 0.5]) is None
    assert ops.input_kinds([True]) is None
    m = next(x for x in model.region_modules() if x.region.form == "layer_norm")
    xs = calls[m.region.name]
    e = ops.register(m, ["tensor"] * len(xs))
    assert e.inputs(list(xs), []) is not None
    # an entry that interleaves ints: inputs come back in the module's order
    e2 = ops.register(m, ["tensor", "int", "tensor"])
    assert e2.inputs(["a", "b"], [7]) == ["a", 7, "b"]


def test_contiguous_strides_match_torch():
    for shape in [(2, 3, 4), (1, 5), (4, 0, 3), (7,)]:
        assert ops.contiguous_strides(shape) == torch.empty(shape).stride()
    t = torch.empty(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    assert ops.channels_last_strides(t.shape) == t.stride()
