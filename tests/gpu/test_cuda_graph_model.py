"""GPU: a whole compiled model (two BERT encoder layers: GEMMs with bias / GELU /
residual epilogues, layer norms, fused attention) captured in ONE CUDA graph and
replayed on new inputs copied into the static input buffer (issue 6 item 4)."""
import collections
import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import TOLERANCE, rel_err
from torch import nn

import cutlass_offload as co

pytestmark = pytest.mark.gpu


class BertLayer(nn.Module):
    """One post-norm BERT encoder layer (hidden 256, 4 heads, FFN 1024): fused QKV
    projection, SDPA, output projection + residual, layer norm, GELU FFN + residual,
    layer norm."""

    def __init__(self, d=256, heads=4, ffn=1024):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        h = self.ln1(self.proj(a) + x)
        return self.ln2(self.fc2(F.gelu(self.fc1(h))) + h)


def test_whole_model_replays_in_one_cuda_graph():
    torch.manual_seed(0)
    model = nn.Sequential(BertLayer(), BertLayer()).eval()
    reference = copy.deepcopy(model).float().cuda()          # float32 reference
    model = model.half().cuda()
    static_x = torch.randn(4, 64, 256, dtype=torch.float16, device="cuda")
    # eager glue: the model captured here is ours (regions + eager PyTorch), with its
    # layer norms offloaded (Inductor glue leaves them to Inductor)
    compiled = co.compile(model, (static_x,), glue="eager")
    forms = collections.Counter(r.form for r in compiled.plan.regions)
    assert forms == {"linear": 8, "layer_norm": 4, "sdpa": 2} and not compiled.plan.fallbacks, \
        compiled.report.format()
    with torch.no_grad():
        compiled(static_x)                # binds the library, sizes the workspaces
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            compiled(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = compiled(static_x)
    regions = compiled.region_modules()
    assert sum(m.fallback_calls for m in regions) == 0, "the graph captured PyTorch fallbacks"
    for trial in range(2):                # new data through the same static buffers
        fresh = torch.randn(4, 64, 256, dtype=torch.float16, device="cuda")
        static_x.copy_(fresh)
        static_out.fill_(float("nan"))    # poisoned: the replay must write every element
        graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            ref = reference(fresh.float())
        assert not static_out.isnan().any(), f"trial {trial}: unwritten (NaN) output"
        err = rel_err(static_out, ref)
        assert err < TOLERANCE[torch.float16], f"trial {trial}: relative error {err:.2e}"


def test_cuda_graphed_model_one_capture_per_signature():
    """CompiledModel.cuda_graphed(): a capture per input signature (dynamic batch:
    two batch sizes, two graphs), replays on fresh data, outputs cloned out so an
    earlier result survives the next call."""
    torch.manual_seed(1)
    model = nn.Sequential(BertLayer(), BertLayer()).eval()
    reference = copy.deepcopy(model).float().cuda()
    model = model.half().cuda()
    example = torch.randn(4, 64, 256, dtype=torch.float16, device="cuda")
    graphed = co.compile(model, (example,), dynamic_batch=True, glue="eager").cuda_graphed()
    outs = []
    with torch.no_grad():
        for batch in (4, 4, 2, 4, 2):
            x = torch.randn(batch, 64, 256, dtype=torch.float16, device="cuda")
            outs.append((x, graphed(x)))
    assert graphed.captures == 2
    for i, (x, out) in enumerate(outs):     # each result intact after the later calls
        with torch.no_grad():
            err = rel_err(out, reference(x.float()))
        assert not out.isnan().any() and err < TOLERANCE[torch.float16], (i, err)
