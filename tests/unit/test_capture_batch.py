"""capture(dynamic_batch=True) with a batch of one: torch.export specializes size-1
dims, so the capture traces a batch-2 copy to keep the batch dynamic; the exported
program must then match the model at batch 1 and at other batches. A model that
only works at batch 1 keeps the static batch-1 export."""
import torch
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from cutlass_offload.capture import capture


class ConvLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, scale):
        return self.lin(self.conv(x).permute(0, 2, 3, 1)) * scale


class OnlyBatchOne(torch.nn.Module):
    def forward(self, x):
        return x.view(4, 6, 6).sum(0)       # a hard-coded batch of one


def _batch_dim(cap):
    ph = [n for n in cap.graph_module.graph.nodes if n.op == "placeholder"]
    return ph[0].meta["val"].shape[0]


def test_a_batch_of_one_stays_dynamic():
    torch.manual_seed(0)
    m = ConvLinear().eval()
    x, scale = torch.randn(1, 4, 6, 6), torch.randn(1, 1, 1, 8)
    cap = capture(m, (x, scale), dynamic_batch=True)
    assert not is_concrete_int(_batch_dim(cap))
    for b in (1, 3):
        xb, sb = torch.randn(b, 4, 6, 6), torch.randn(b, 1, 1, 8)
        with torch.no_grad():
            torch.testing.assert_close(cap.exported.module()(xb, sb), m(xb, sb))


def test_static_when_asked_and_doubled_only_for_a_batch_of_one():
    from cutlass_offload.capture import _batch_two
    m = ConvLinear().eval()
    x = torch.randn(1, 4, 6, 6)
    assert _batch_dim(capture(m, (x, torch.randn(1, 1, 1, 8)))) == 1      # not asked
    # another input's dim 0 is not 1, or a scalar tensor: not a batch of one
    assert _batch_two((x, torch.randn(3, 8))) is None
    assert _batch_two((x, torch.tensor(2.0))) is None
    doubled = _batch_two((x, 5))
    assert doubled[0].shape == (2, 4, 6, 6) and torch.equal(doubled[0][1], x[0]) and doubled[1] == 5


def test_a_model_that_needs_batch_one_keeps_the_static_export():
    cap = capture(OnlyBatchOne(), (torch.randn(1, 4, 6, 6),), dynamic_batch=True)
    assert _batch_dim(cap) == 1


def test_inputs_of_another_dtype_than_the_parameters_warn_and_say_why():
    """model.half() forgotten: co.compile warns before the capture, the mixed GEMM's
    fallback says PyTorch refuses it too, and the report says nothing was offloaded."""
    import pytest

    import cutlass_offload as co
    from cutlass_offload.capture import dtype_mismatch
    lin = torch.nn.Linear(16, 8)
    half = torch.randn(4, 16, dtype=torch.float16)
    assert "float16 but the model's parameters are float32" in dtype_mismatch(lin, (half,))
    assert dtype_mismatch(lin, (half.float(),)) is None
    assert dtype_mismatch(lin.half(), (half, torch.arange(3))) is None   # ints do not count
    assert dtype_mismatch(torch.nn.ReLU(), (half,)) is None              # no parameters
    with pytest.warns(UserWarning, match=r"model.to\(torch.float16\)"):
        compiled = co.compile(torch.nn.Linear(16, 8), (half,), arch="sm_90a")
    text = compiled.report.format()
    assert "nothing offloaded" in text and "PyTorch's own matmul refuses them" in text


def test_a_data_dependent_forward_gets_what_to_do_and_its_line():
    """A forward that branches on a tensor's value, or reads one into Python, cannot be
    exported: the CaptureError says what to do first, then torch's text naming the line."""
    import pytest

    import cutlass_offload as co
    from cutlass_offload.capture import capture_hint

    class Branch(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x

    class Item(torch.nn.Module):
        def forward(self, x):
            return x * float(x.max().item())

    for model in (Branch(), Item()):
        with pytest.raises(co.CaptureError) as info:
            co.compile(model, (torch.randn(8, 4),), arch="sm_80")
        text = str(info.value)
        assert text.startswith("torch.export could not capture the model on its example inputs: "
                               "the forward branches on, sizes a tensor by, or reads into Python")
        assert "torch.cond" in text and "GuardOnDataDependentSymNode" in text
        assert "test_capture_batch.py" in text          # torch's text: the user's line
    assert capture_hint(ValueError("x")) is None
    # found through the chain torch raises it in
    inner = type("GuardOnDataDependentSymNode", (RuntimeError,), {})("u0")
    outer = RuntimeError("wrapped")
    outer.__cause__ = inner
    assert capture_hint(outer).startswith("the forward branches on")


def test_dynamic_batch_with_dynamic_shapes_is_refused_before_any_work():
    """torch.export takes dynamic_shapes as given: with dynamic_batch too the batch would
    have stayed static without a word (a fresh-user trial, session 53)."""
    import pytest

    import cutlass_offload as co
    seq = torch.export.Dim("seq", min=2, max=64)
    with pytest.raises(ValueError, match=r"mark the batch in dynamic_shapes"):
        co.compile(torch.nn.Linear(8, 8), (torch.randn(4, 6, 8),), arch="sm_80",
                   dynamic_batch=True, dynamic_shapes=({1: seq},))


def test_a_returned_transformers_cache_gets_the_use_cache_hint():
    """A decoder built from its config returns a DynamicCache (use_cache=True by
    default); torch.export's pytree text points elsewhere (a fresh-user trial, s54)."""
    import pytest

    import cutlass_offload as co

    class Cache:                       # stands for transformers.cache_utils.DynamicCache
        pass
    Cache.__module__ = "transformers.cache_utils"

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.l(x), Cache()

    with pytest.raises(co.CaptureError, match="use_cache=False"):
        co.compile(Decoder(), (torch.randn(2, 8),), arch="sm_80")


def test_keyword_only_and_surplus_inputs_are_named_before_the_capture():
    import pytest

    import cutlass_offload as co

    class KwOnly(torch.nn.Module):
        def forward(self, x, *, mask):
            return x * mask

    class KwOnlyDefault(torch.nn.Module):
        def forward(self, x, *, scale=2.0):
            return x * scale

    class One(torch.nn.Module):
        def forward(self, x):
            return x + 1
    x = torch.randn(2, 8)
    with pytest.raises(TypeError, match=r"keyword-only parameter\(s\) mask without a default"):
        co.compile(KwOnly(), (x, x), arch="sm_80")
    with pytest.raises(TypeError, match=r"2 example inputs for One.forward, which takes 1 "
                                        r"positional parameter\(s\) \(x\)"):
        co.compile(One(), (x, {"y": x}), arch="sm_80")
    with pytest.raises(TypeError, match="keyword-only"):
        co.explain(KwOnly(), (x, x), arch="sm_80")
    # a keyword-only parameter with a default keeps it: no refusal before the capture
    assert co.explain(KwOnlyDefault(), (x,), arch="sm_80").report is not None


def test_an_fp16_only_branch_gets_the_bf16_hint():
    """transformers' BART checks fp16 activations for overflow with a data-dependent
    branch; a bf16 model does not take it (fresh-user trial, session 54)."""
    import pytest

    import cutlass_offload as co

    class Clamp(torch.nn.Module):
        def forward(self, x):
            if x.dtype == torch.float16 and not torch.isfinite(x).all():
                x = x.clamp(-1000, 1000)
            return x * 2
    with pytest.raises(co.CaptureError, match=r"--dtype bf16"):
        co.compile(Clamp(), (torch.randn(4, 8).half(),), arch="sm_80")
    co.explain(Clamp(), (torch.randn(4, 8).bfloat16(),), arch="sm_80")     # captures
