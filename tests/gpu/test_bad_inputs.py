"""GPU: calls a compiled model was not built for (issue 7, item 5) get a clear error
or a correct PyTorch fallback for that call, never wrong output or a CUDA fault;
a launcher's run-time "cannot implement" falls back for that call only; verify
mode accepts PyTorch's own inf. One small library: a GEMM, a layer norm, a conv
and a group norm + SiLU region, static shapes."""
import copy
import warnings

import pytest
import torch
from bad_input_cases import Block
from helpers import TOLERANCE, poison_allocator, rel_err
from torch import nn

import cutlass_offload as co
from cutlass_offload.errors import DeviceError
from cutlass_offload.runtime.library import CO_CANNOT_IMPLEMENT

pytestmark = pytest.mark.gpu
H = torch.float16
CL = torch.channels_last


def _inputs(device="cuda"):
    return (torch.randn(8, 64, dtype=H, device=device),
            torch.randn(2, 16, 8, 8, dtype=H, device=device).to(memory_format=CL))


@pytest.fixture(scope="module")
def built():
    torch.manual_seed(0)
    model = Block().half()
    # eager glue: these are the region modules' own checks (with Inductor glue, "auto"
    # norms leave the layer norm to Inductor, and Dynamo guards the inputs first)
    compiled = co.compile(model, _inputs("cpu"), arch=co.resolve_arch(None), glue="eager").to("cuda")
    assert len(compiled.plan.regions) == 4, compiled.report.format()
    return compiled, copy.deepcopy(model).float().cuda()


def _check(compiled, reference, xs):
    poison_allocator()
    with torch.no_grad():
        outs = compiled(*xs)
        refs = reference(*(x.float() for x in xs))
    for out, ref in zip(outs, refs):
        assert out.dtype == H and out.shape == ref.shape
        assert rel_err(out, ref) < TOLERANCE[H]


def _fallbacks(compiled):
    return sum(m.fallback_calls for m in compiled.region_modules())


def test_fitting_call_runs_every_kernel(built):
    compiled, reference = built
    before = _fallbacks(compiled)
    _check(compiled, reference, _inputs())
    assert _fallbacks(compiled) == before


def test_cpu_tensors_raise_device_error(built):
    compiled, _ = built
    with pytest.raises(DeviceError, match="inputs are on cpu"):
        compiled(*_inputs("cpu"))


@pytest.mark.parametrize("which, shape", [(0, (4, 64)), (1, (2, 16, 9, 9))])
def test_other_static_shape_is_an_error_before_any_kernel(built, which, shape):
    compiled, reference = built
    xs = list(_inputs())
    xs[which] = torch.randn(shape, dtype=H, device="cuda")
    calls = [m.calls for m in compiled.region_modules()]
    with pytest.raises(Exception, match=r"size|shape"):
        compiled(*xs)
    assert [m.calls for m in compiled.region_modules()] == calls
    _check(compiled, reference, _inputs())          # still usable: no CUDA fault


def test_other_dtype_gets_pytorch_error_not_a_fault(built):
    compiled, reference = built
    x, img = _inputs()
    with pytest.raises(RuntimeError, match="dtype|type"):
        compiled(x.float(), img)                    # fp16 weights: PyTorch's own error
    torch.cuda.synchronize()
    _check(compiled, reference, _inputs())


def test_non_contiguous_inputs_are_correct(built):
    compiled, reference = built
    x, img = _inputs()
    x_t = x.t().contiguous().t()                    # (8, 64) with K not contiguous
    img_nchw = img.contiguous()                     # NCHW: converted for the call
    _check(compiled, reference, (x_t, img_nchw))


def _misaligned(t):
    """The same values at a 2-byte offset (not 16-byte aligned), same memory format."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    if t.dim() == 4:
        v = buf[1:].view(t.shape[0], t.shape[2], t.shape[3], t.shape[1]).permute(0, 3, 1, 2)
    else:
        v = buf[1:].view_as(t)
    return v.copy_(t)


def test_misaligned_slices_fall_back_for_that_call(built):
    compiled, reference = built
    x, img = _inputs()
    before = {m.region.name: m.fallback_calls for m in compiled.region_modules()}
    _check(compiled, reference, (_misaligned(x), _misaligned(img)))
    after = {m.region.name: m.fallback_calls for m in compiled.region_modules()}
    fell = sorted(n for n in after if after[n] > before[n])
    # the GEMM and the conv read the misaligned inputs; the norms get fresh outputs
    assert any("linear" in n for n in fell) and any("conv" in n for n in fell), fell
    again = _fallbacks(compiled)
    _check(compiled, reference, _inputs())          # the next aligned call runs the kernels
    assert _fallbacks(compiled) == again


def test_cannot_implement_at_run_time_falls_back_for_that_call(built):
    """A launcher returning CO_CANNOT_IMPLEMENT (its can_implement refused the
    problem) runs PyTorch for that call; the next call launches again."""
    compiled, reference = built
    _check(compiled, reference, _inputs())          # binds every launcher
    for mod in compiled.region_modules():
        real = mod._fn
        refused = []
        # the refusal is injected at the ctypes launcher: keep these calls on the
        # Python path (the C++ path calls the library directly; its refusals are
        # covered by tests/unit/test_fast_call.py)
        mod._fast = None
        mod._fast_operands = lambda: None

        def once(args, stream, real=real, refused=refused):
            if not refused:
                refused.append(True)
                return CO_CANNOT_IMPLEMENT
            return real(args, stream)
        mod._fn = once
        try:
            before = mod.fallback_calls
            _check(compiled, reference, _inputs())
            assert mod.fallback_calls == before + 1, mod.region.name
            _check(compiled, reference, _inputs())
            assert mod.fallback_calls == before + 1, mod.region.name
        finally:
            mod._fn = real
            del mod._fast_operands


def test_verify_mode_accepts_pytorch_inf():
    """An fp16 overflow that PyTorch also turns into inf is agreement, not a failure."""
    lin = nn.Linear(64, 32)
    with torch.no_grad():
        lin.weight *= 100                               # products ~6e4: some overflow fp16
    lin = lin.half()
    x = torch.randn(8, 64, dtype=H) * 1000
    compiled = co.compile(lin, (x,), arch=co.resolve_arch(None), verify=True).to("cuda")
    xc = x.cuda()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(xc)
        ref = lin.cuda()(xc)
    assert ref.isinf().any(), "the case does not overflow"
    assert not [w for w in caught if "disagrees" in str(w.message)]
    (m,) = compiled.region_modules()
    assert m.disabled is None
    assert torch.equal(out.isinf(), ref.isinf())
