"""GPU: Swin's window attention (relative position bias + shift mask around a view
that splits the windows' batch) runs as one attention region with the summed bias
(partition/window_bias.py) on fresh inputs, outputs poisoned, against float32, with
eager and Inductor glue, fp16 and bf16, and a second window batch.

The window batch is dynamic as a whole model gives it: a multiple of the window
count (Swin's B * nW). With ``dynamic_batch=True`` and the mask an input, the window
count itself becomes a symbol and the model's own ``view(-1, H, N, N)`` gives the
probabilities a batch that does not provably equal v's, so the attention stays in
PyTorch with that reason (tests/unit/test_window_attention.py)."""
import copy

import pytest
import torch
from torch.export import Dim

import cutlass_offload as co
from cutlass_offload.ir import AttentionRegion
from helpers import TOLERANCE, poison_allocator, rel_err
from window_cases import WindowAttention, inputs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("glue", ["eager", "inductor"])
def test_window_attention_matches_float32(dtype, glue):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    torch.manual_seed(0)
    eager = WindowAttention(dim=96, ws=7, heads=3).to("cuda", dtype).eval()
    ref = copy.deepcopy(eager).float()
    x, mask = (t.cuda() for t in inputs(n=49, dim=96, dtype=dtype))
    windows = 4 * Dim("b", min=1, max=64)           # inputs() has 4 windows per image
    m = co.compile(eager, (x, mask), glue=glue, dynamic_shapes=({0: windows}, None))
    att = [r for r in m.plan.regions if isinstance(r, AttentionRegion)]
    assert len(att) == 1 and att[0].bias_kind == "float", m.report
    with torch.no_grad():
        for batch, seed in ((2, 1), (3, 2)):
            x, mask = (t.cuda() for t in inputs(batch=batch, n=49, dim=96, dtype=dtype, seed=seed))
            poison_allocator()
            out = m(x, mask)
            err = rel_err(out, ref(x.float(), mask.float()))
            assert err < TOLERANCE[dtype], (glue, batch, err)
    calls = [(mod.calls, mod.fallback_calls) for mod in m.region_modules()
             if isinstance(mod.region, AttentionRegion)]
    assert calls and all(c > 0 and f == 0 for c, f in calls), calls   # the kernel ran
