"""GPU: a folder compiled on the CPU, loaded onto the GPU with device="cuda" and
Inductor glue (no fallback to eager glue allowed), runs a model with dtype casts
(``.to(float32)`` / ``.to(float16)``: the graph's ``_assert_tensor_metadata``
checks) and combined sibling linears, against float32 on fresh inputs with the
outputs poisoned. Before api._indexed the glue failed to trace ("Tensor device
mismatch! Expected: cuda, Got: cuda:0") and such models ran with eager glue."""
import copy

import pytest
import torch
import torch.nn as nn

import cutlass_offload as co
from helpers import TOLERANCE, poison_allocator, rel_err

pytestmark = pytest.mark.gpu


class CastsAndSiblings(nn.Module):
    def __init__(self, d=256):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, 64), nn.Linear(d, 64)

    def forward(self, x):
        logits = (self.k(x) @ self.v(x).transpose(1, 2)).to(torch.float32)
        w = logits.softmax(-1).to(x.dtype)
        return torch.relu(self.q(x)) + (w @ x)


def test_folder_loaded_on_cuda_compiles_its_glue(tmp_path):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU (sm_90a kernels)")
    torch.manual_seed(0)
    model = CastsAndSiblings().half().eval()
    ref = copy.deepcopy(model).cuda().float()
    co.compile(model, (torch.randn(2, 64, 256).half(),), arch="sm_90a", out_dir=tmp_path / "out")
    compiled, _, _ = co.load(tmp_path / "out", device="cuda", glue="inductor")
    assert any("combines" in n for r in compiled.plan.regions for n in r.notes), compiled.report
    gen = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 64, 256, generator=gen, device="cuda").half()
            poison_allocator()
            err = rel_err(compiled(x), ref(x.float()))
            assert err < TOLERANCE[torch.float16], err
    assert compiled.glue == "inductor"


def test_folder_of_a_cuda_model_loads_its_weights_back_on_cuda(tmp_path):
    """weights.bin of a model exported on the GPU: co.load without a device puts
    every tensor back on cuda:0 (one copy per storage), and it runs."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU (sm_90a kernels)")
    torch.manual_seed(2)
    model = CastsAndSiblings().half().eval().cuda()
    ref = copy.deepcopy(model).float()
    co.compile(model, (torch.randn(2, 64, 256, device="cuda").half(),), arch="sm_90a",
               out_dir=tmp_path / "out", glue="eager")
    assert (tmp_path / "out" / "weights.bin").is_file()
    compiled, reference, _ = co.load(tmp_path / "out")
    assert all(p.device.type == "cuda" for p in reference.parameters())
    gen = torch.Generator(device="cuda").manual_seed(3)
    with torch.no_grad():
        x = torch.randn(2, 64, 256, generator=gen, device="cuda").half()
        poison_allocator()
        err = rel_err(compiled(x), ref(x.float()))
    assert err < TOLERANCE[torch.float16], err
