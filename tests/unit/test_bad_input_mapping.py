"""Calls a compiled model cannot run on its kernels (no GPU: CPU tensors, no launch):
a clear error or a refusal that runs the region's PyTorch subgraph, never a
mis-mapped launch. Verify mode's comparison accepts PyTorch's own inf / NaN."""
import pytest
import torch
from bad_input_cases import Block

from cutlass_offload.capture import capture
from cutlass_offload.errors import DeviceError
from cutlass_offload.partition import partition
from cutlass_offload.runtime.compiled_model import CompiledModel, offload
from cutlass_offload.runtime.region import disagreement
from cutlass_offload.select import select

H = torch.float16
CL = torch.channels_last


def _inputs():
    return torch.randn(8, 64, dtype=H), torch.randn(2, 16, 8, 8, dtype=H).to(memory_format=CL)


@pytest.fixture(scope="module")
def block():
    cap = capture(Block().half(), _inputs())
    plan = select(partition(cap.graph_module), "sm90a")
    gm = offload(cap.graph_module, plan, library_path=None)
    model = CompiledModel(gm, plan, None, None)
    mods = {type(m).__name__: m for m in model.region_modules()}
    assert sorted(mods) == ["ConvRegionModule", "GemmRegionModule", "GroupNormRegionModule",
                            "NormRegionModule"]
    return model, mods


def test_cpu_tensors_raise_a_clear_device_error(block, monkeypatch):
    model, _ = block
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(DeviceError, match="inputs are on cpu; the compiled model runs its offloaded "
                                          r"regions on a CUDA GPU: move it and its inputs there") as e:
        model(*_inputs())
    assert "model.to('cuda')" in str(e.value)


def test_without_a_gpu_the_error_says_so_and_points_at_the_reference(block, monkeypatch):
    """No advice to move the model to a GPU the process cannot see."""
    model, _ = block
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match=r"inputs are on cpu; .* sees none") as e:
        model(*_inputs())
    assert "co.load(folder)[1]" in str(e.value) and ".to('cuda')" not in str(e.value)


@pytest.mark.parametrize("which, shape", [(0, (4, 64)), (0, (8, 48)), (1, (2, 16, 9, 9)), (1, (3, 16, 8, 8))])
def test_other_static_shape_is_refused_before_any_region(block, which, shape):
    """The dims were static at export: torch.export's input guard names the size."""
    model, mods = block
    xs = list(_inputs())
    xs[which] = torch.randn(shape, dtype=H)
    calls = {n: m.calls for n, m in mods.items()}
    with pytest.raises(Exception, match=r"size|shape") as e:
        model(*xs)
    assert not isinstance(e.value, DeviceError)          # refused before a region ran
    assert {n: m.calls for n, m in mods.items()} == calls


@pytest.fixture(scope="module")
def region_args(block):
    """{module class name: the inputs it receives}: every region records its call
    and runs PyTorch (CPU tensors), in one pass through the graph."""
    model, mods = block
    seen = {}

    def recording(name, m):
        def forward(*args):
            seen[name] = list(args)
            return m.fallback(*args)
        return forward
    for name, m in mods.items():
        m.forward = recording(name, m)
    try:
        with torch.no_grad():
            model(*_inputs())
    finally:
        for m in mods.values():
            del m.forward                 # back to the class's forward
    return seen


KINDS = ["GemmRegionModule", "ConvRegionModule", "NormRegionModule", "GroupNormRegionModule"]


@pytest.mark.parametrize("kind", KINDS)
def test_fitting_call_maps(block, region_args, kind):
    _, mods = block
    assert mods[kind]._map(region_args[kind]) is not None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", ["float32", "bfloat16", "misaligned", "param_dtype"])
def test_call_that_does_not_fit_runs_pytorch(block, region_args, kind, bad):
    _, mods = block
    mod = mods[kind]
    args = list(region_args[kind])
    primary = mod.primary
    x = args[primary]
    if bad in ("float32", "bfloat16"):
        args[primary] = x.to(getattr(torch, bad))
    elif bad == "misaligned":             # a slice at an odd element offset (2 bytes)
        buf = torch.empty(x.numel() + 1, dtype=x.dtype)
        if x.dim() == 4:
            nhwc = buf[1:].view(x.shape[0], x.shape[2], x.shape[3], x.shape[1])
            args[primary] = nhwc.permute(0, 3, 1, 2).copy_(x)
        else:
            args[primary] = buf[1:].view_as(x).copy_(x)
        assert args[primary].data_ptr() % 16 == 2
    else:                                 # a parameter of another dtype than the input
        i = next(i for i in range(len(args)) if i != primary and args[i].dim() >= 1)
        args[i] = args[i].float()
    mod._direct.clear()
    assert mod._map(args) is None


def test_non_contiguous_inputs_are_copied_not_misread(block, region_args):
    _, mods = block
    norm = mods["NormRegionModule"]
    args = list(region_args["NormRegionModule"])
    x = args[norm.primary]
    args[norm.primary] = torch.stack([x, x], dim=-1)[..., 0]       # stride 2 along the row
    _, cargs, keep = norm._map(args)
    assert keep[0].is_contiguous() and torch.equal(keep[0], x) and cargs.input == keep[0].data_ptr()
    conv = mods["ConvRegionModule"]
    args = list(region_args["ConvRegionModule"])
    nchw = args[conv.primary].contiguous()                         # NCHW: converted for the call
    args[conv.primary] = nchw
    before = conv.layout_conversions
    _, cargs, keep = conv._map(args)
    assert conv.layout_conversions == before + 1
    assert torch.equal(keep[0].permute(0, 3, 1, 2), nchw) and cargs.x == keep[0].data_ptr()


# -- verify mode's comparison --------------------------------------------------------------

def test_same_inf_nan_pattern_agrees():
    ref = torch.tensor([[1.0, float("inf"), float("nan")], [-float("inf"), 2.0, 3.0]], dtype=H)
    out = ref.clone()
    out[1, 1] = 2.001
    assert disagreement(out, ref, 1e-2) is None


@pytest.mark.parametrize("change, why", [
    (lambda o: o.__setitem__((0, 1), 65504.0), "inf at other elements"),     # clamped overflow
    (lambda o: o.__setitem__((0, 1), float("-inf")), "inf at other elements"),  # sign
    (lambda o: o.__setitem__((0, 2), 0.0), "NaN at other elements"),         # relu(NaN) = 0
    (lambda o: o.__setitem__((1, 2), float("nan")), "NaN at other elements"),
    (lambda o: o.__setitem__((1, 2), 4.0), "relative error"),
])
def test_other_pattern_or_values_disagree(change, why):
    ref = torch.tensor([[1.0, float("inf"), float("nan")], [-float("inf"), 2.0, 3.0]], dtype=H)
    out = ref.clone()
    change(out)
    assert why in disagreement(out, ref, 1e-2)
