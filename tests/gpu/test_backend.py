"""GPU: the same pipeline as a torch.compile backend."""
import pytest
import torch
import torch.nn as nn

import cutlass_offload as co
from helpers import TOLERANCE, poison_allocator, rel_err

pytestmark = pytest.mark.gpu


def test_torch_compile_backend_offloads_and_matches():
    model = nn.Sequential(nn.Linear(128, 256), nn.GELU()).half().cuda().eval()
    backend = co.make_backend()
    fast = torch.compile(model, backend=backend)
    x = torch.randn(64, 128, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        fast(x)
        (compiled,) = backend.compiled
        assert [r.problem.epilogue.tag for r in compiled.plan.regions] == ["bias_gelu"]
        x = torch.randn(64, 128, dtype=torch.float16, device="cuda")   # fresh data
        poison_allocator()
        out = fast(x)
        ref = model.float()(x.float())
    assert compiled.region_modules()[0].fallback_calls == 0
    assert rel_err(out, ref) < TOLERANCE[torch.float16]
