"""CompiledModel's input check (no GPU): torch.export's structure / shape check runs
once per input signature, not on every forward, and still rejects a call that
breaks a static size whatever was called before."""
import pytest
import torch

from cutlass_offload.capture import capture
from cutlass_offload.ir import Plan
from cutlass_offload.runtime import compiled_model
from cutlass_offload.runtime.compiled_model import CompiledModel


class Scale(torch.nn.Module):
    def forward(self, x, y):
        return x * 2 + y


@pytest.fixture
def model():
    cap = capture(Scale(), (torch.randn(8, 16), torch.randn(8, 16)))
    return CompiledModel(cap.graph_module, Plan(arch="sm90a", regions=(), kernels=(), fallbacks=()), None, None)


def test_check_runs_once_per_signature(model, monkeypatch):
    calls = []
    real = compiled_model._check_input_constraints_pre_hook

    def counting(gm, args, kwargs):
        calls.append(tuple(a.shape for a in args))
        return real(gm, args, kwargs)
    monkeypatch.setattr(compiled_model, "_check_input_constraints_pre_hook", counting)
    for _ in range(3):
        x, y = torch.randn(8, 16), torch.randn(8, 16)
        torch.testing.assert_close(model(x, y), x * 2 + y)
    assert len(calls) == 1
    assert model.graph_module.validate_inputs is True       # restored after each call


@pytest.mark.parametrize("first_valid", [True, False])
def test_other_static_size_is_still_rejected(model, first_valid):
    if first_valid:
        model(torch.randn(8, 16), torch.randn(8, 16))
    with pytest.raises(Exception, match="8|16"):
        model(torch.randn(9, 16), torch.randn(9, 16))
    with pytest.raises(Exception):
        model(torch.randn(8, 16))                          # wrong structure
    assert model.graph_module.validate_inputs is True
