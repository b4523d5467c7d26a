"""GPU: two libraries holding the same CUTLASS 2.x kernel, loaded in one process,
both run. A 2.x GemmUniversalBase raises its kernel's shared memory limit once per
thread, guarded by template statics; exported, those were merged across libraries
(STB_GNU_UNIQUE) and the second library's kernel (64 KiB of shared memory) failed
to launch. Libraries now export co_* only (emit/templates/exports.map)."""
import shutil

import pytest
import torch
from helpers import TOLERANCE, poison_allocator, rel_err

import cutlass_offload as co

pytestmark = pytest.mark.gpu


def test_same_2x_kernel_in_two_loaded_libraries(tmp_path):
    torch.manual_seed(0)
    # N = 4097 is not a multiple of 8: the sm_90a plan keeps a 2.x kernel with
    # 1-element output alignment, 128x128x32 tiles in 4 stages (64 KiB > 48 KiB)
    model = torch.nn.Linear(256, 4097, bias=False).half()
    x = torch.randn(256, 256, dtype=torch.float16)
    first = co.compile(model, (x,), arch="sm_90a", out_dir=tmp_path / "a")
    (kernel,) = first.plan.distinct_kernels
    assert kernel.name.startswith("cutlass2x_sm80_gemm") and "128x128x32" in kernel.name
    shutil.copytree(tmp_path / "a", tmp_path / "b")          # same kernel, another .so
    models = [co.load(tmp_path / d, device="cuda")[0] for d in ("a", "b")]
    w = model.weight.detach().cuda()
    for _ in range(2):
        for m in models:
            xs = torch.randn(256, 256, dtype=torch.float16, device="cuda")
            poison_allocator()
            with torch.no_grad():
                out = m(xs)
            torch.cuda.synchronize()
            ref = xs.float() @ w.float().t()
            assert rel_err(out, ref) < TOLERANCE[torch.float16]
            assert sum(r.fallback_calls for r in m.region_modules()) == 0
