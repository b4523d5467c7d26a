"""GPU: the SiLU and sigmoid epilogues (templates/activations.h co_act::SiLU / Sigmoid:
ex2.approx and rcp.approx instead of an IEEE divide) match PyTorch: against a float32
reference on fresh random inputs, and element for element against PyTorch in the
same dtype where the activation's input overflows fp16 (silu(-inf) is NaN,
silu(inf) inf, sigmoid 0 / 1) or lies near -87, where bf16 keeps PyTorch's tiny
silu value (about -9e-37: the reciprocal's subnormal result is not flushed).

On sm_90a, N = 64: CUTLASS 3.x with the EVT; N = 61: CUTLASS 2.x (sm80 kernels). One
model holds every case, so one build compiles them side by side."""
import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import TOLERANCE, poison_allocator, rel_err
from torch import nn

import cutlass_offload as co

pytestmark = pytest.mark.gpu
M, K = 96, 64
CASES = [("silu", torch.float16, 64), ("sigmoid", torch.float16, 64), ("silu", torch.bfloat16, 64),
         ("silu", torch.float16, 61), ("sigmoid", torch.float16, 61)]
ACT = {"silu": F.silu, "sigmoid": torch.sigmoid}


class Acts(nn.Module):
    """One Linear + activation per case; column 0 of each output is 100 x[:, 0] (it
    overflows fp16 at |x| = 1000), column 1 is x[:, 0]."""

    def __init__(self):
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(K, n).to(dtype) for _, dtype, n in CASES)
        with torch.no_grad():
            for lin in self.lins:
                lin.weight[:, 2:].mul_(0.05)
                lin.weight[:2].zero_()
                lin.weight[0, 0], lin.weight[1, 0] = 100.0, 1.0
                lin.bias[:2].zero_()

    def forward(self, x):
        return tuple(ACT[act](lin(x.to(lin.weight.dtype))) for lin, (act, _, _) in zip(self.lins, CASES))


@pytest.fixture(scope="module")
def compiled():
    torch.manual_seed(0)
    model = Acts().cuda().eval()
    compiled = co.compile(model, (torch.randn(M, K, device="cuda", dtype=torch.float16),), arch="sm_90a")
    kernels = {(k.epilogue.activation, k.dtype, k.config.family) for k in compiled.plan.distinct_kernels}
    assert kernels == {(act, {torch.float16: "f16", torch.bfloat16: "bf16"}[dt],
                        "cutlass3x_sm90" if n % 8 == 0 else "cutlass2x_sm80") for act, dt, n in CASES}
    assert not compiled.plan.fallbacks
    return model, compiled


def test_outputs_match_float32_on_fresh_inputs(compiled):
    model, compiled = compiled
    ref = copy.deepcopy(model).float()
    for _ in range(2):
        x = torch.randn(M, K, device="cuda", dtype=torch.float16)
        poison_allocator()
        with torch.no_grad():
            outs, refs = compiled(x), ref(x.float())
        for (act, dtype, n), out, expect in zip(CASES, outs, refs):
            assert not out.isnan().any() and rel_err(out, expect) < TOLERANCE[dtype], (act, dtype, n)


def test_specials_match_pytorch_in_the_same_dtype(compiled):
    model, compiled = compiled
    x = torch.randn(M, K, device="cuda", dtype=torch.float16)
    x[:4, 0] = torch.tensor([1000.0, -1000.0, -87.5, 3.0])
    with torch.no_grad():
        outs, theirs_all = compiled(x), model(x)
    torch.cuda.synchronize()
    for (act, dtype, n), ours, theirs in zip(CASES, outs, theirs_all):
        case = (act, dtype, n)
        assert torch.equal(ours.isnan(), theirs.isnan()), case
        assert torch.equal(ours.isinf(), theirs.isinf()), case
        assert torch.equal(ours[ours.isinf()], theirs[theirs.isinf()]), case
        if dtype == torch.float16:      # column 0, rows 0 / 1: +-1e5, +-inf in fp16 before the act
            assert (ours[0, 0].isinf() and ours[0, 0] > 0) if act == "silu" else ours[0, 0] == 1.0, case
            assert ours[1, 0].isnan() if act == "silu" else ours[1, 0] == 0.0, case
        else:                           # column 1, row 2: silu(-87.5), about -9e-37 in bf16
            assert theirs[2, 1] < 0 and abs(float(ours[2, 1]) / float(theirs[2, 1]) - 1) < 0.02, case
        finite = ~(ours.isnan() | ours.isinf())
        assert rel_err(ours[finite], theirs[finite]) < TOLERANCE[dtype], case
