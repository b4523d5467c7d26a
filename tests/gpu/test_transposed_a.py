"""GPU: Linears on a transposed view (issue 19; the VAE's attention projections, whose
input is ``x.view(b, c, h * w).transpose(1, 2)``) read A column-major in place, on
the sm90a TMA kernels and the sm80 2.x kernels; the q / k / v siblings combine into
one GEMM. A dynamic batch (one column-major matrix per batch entry, the weight
shared), fresh inputs, outputs poisoned, against float32."""
import copy

import pytest
import torch
import torch.nn as nn

import cutlass_offload as co
from cutlass_offload.ir import GemmRegion
from helpers import TOLERANCE, check_fresh_outputs, poison_allocator, rel_err

pytestmark = pytest.mark.gpu


class Projections(nn.Module):
    def __init__(self, c=128):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(c, c), nn.Linear(c, c), nn.Linear(c, c)

    def forward(self, x):
        b, c, h, w = x.shape
        t = x.view(b, c, h * w).transpose(1, 2)           # (b, h*w, c), h*w contiguous
        return torch.cat([self.q(t), self.k(t), self.v(t)], dim=-1)


ARCH_DTYPES = [("sm_90a", torch.float16), ("sm_90a", torch.bfloat16), ("sm_80", torch.float16)]


def _skip_unless_gpu_runs(arch):
    from cutlass_offload.target import ALIASES, TARGETS
    if not torch.cuda.is_available() or not TARGETS[ALIASES[arch]].runs_on(
            torch.cuda.get_device_capability()):
        pytest.skip(f"needs a GPU that runs {arch} kernels (an sm_80 library refuses an H200)")


def _input(batch, seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(batch, 128, 16, 24, generator=g, device="cuda").to(dtype)


@pytest.mark.parametrize("arch, dtype", ARCH_DTYPES)
def test_transposed_input_linears_match_float32(arch, dtype):
    _skip_unless_gpu_runs(arch)
    torch.manual_seed(0)
    eager = Projections().to("cuda", dtype).eval()
    ref = copy.deepcopy(eager).float()
    m = co.compile(eager, (_input(2, 0, dtype),), arch=arch, dynamic_batch=True)
    gemms = [r for r in m.plan.regions if isinstance(r, GemmRegion)]
    assert gemms and all(r.problem.layout_a == "col" for r in gemms), m.report
    assert any("combines" in n for r in gemms for n in r.notes), m.report
    with torch.no_grad():
        for batch, seed in ((2, 1), (3, 2), (1, 3)):
            x = _input(batch, seed, dtype)
            poison_allocator()
            out = m(x)
            err = rel_err(out, ref(x.float()))
            assert err < TOLERANCE[dtype], (arch, batch, seed, err)
    calls = {mod.region.name: (mod.calls, mod.fallback_calls) for mod in m.region_modules()
             if isinstance(mod.region, GemmRegion)}
    assert calls and all(c > 0 and f == 0 for c, f in calls.values()), calls   # the kernel ran


class Matmuls(nn.Module):
    """mm / bmm / matmul / addmm on transposed views, B row-major or itself a
    transposed view, in each batch mode: fold, B shared (b_broadcast), batched, A
    broadcast and a partial broadcast (expanded)."""

    def forward(self, x2, w, bias, x3, w3, x4, w4):
        a2 = x2.t()                                          # (64, 48), M contiguous
        return (torch.mm(a2, w), torch.mm(a2, w.t().contiguous().t()),
                torch.addmm(bias, a2, w), torch.matmul(x3.transpose(-1, -2), w),
                torch.bmm(x3.transpose(1, 2), w3), torch.matmul(a2, w3),
                torch.matmul(x4.transpose(-1, -2), w4))


def _matmul_inputs(seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = [(48, 64), (48, 40), (40,), (3, 48, 64), (3, 48, 40), (2, 1, 48, 64), (2, 3, 48, 40)]
    return tuple(torch.randn(s, generator=g, device="cuda").to(dtype) for s in shapes)


@pytest.mark.parametrize("arch, dtype", ARCH_DTYPES)
def test_transposed_a_matmuls_match_float32(arch, dtype):
    _skip_unless_gpu_runs(arch)
    m = co.compile(Matmuls(), _matmul_inputs(0, dtype), arch=arch)
    gemms = [r for r in m.plan.regions if isinstance(r, GemmRegion)]
    assert len(gemms) == 7 and all(r.problem.layout_a == "col" for r in gemms), m.report
    assert {r.batch_mode for r in gemms} == {"fold", "b_broadcast", "batched", "a_broadcast", "expand"}
    check_fresh_outputs(m, Matmuls(), lambda r: _matmul_inputs(r + 1, dtype), dtype,
                        ["mm", "mm_bt", "addmm", "b_broadcast", "bmm", "a_broadcast", "expand"])
    calls = [(mod.calls, mod.fallback_calls) for mod in m.region_modules()
             if isinstance(mod.region, GemmRegion)]
    assert calls and all(c > 0 and f == 0 for c, f in calls), calls   # the kernels ran
