"""Glue tests without a GPU: a model with one region of each kind (fp32 with TF32
allowed, so they offload on CPU), its offloaded CompiledModel, and region modules
that run their PyTorch fallback on CPU and hand back what the kernel path would:
a fresh tensor in the module's own output layout."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.partition import partition
from cutlass_offload.runtime.compiled_model import CompiledModel, offload
from cutlass_offload.runtime.region import RegionModule
from cutlass_offload.select import select

OPTIONS = CompileOptions(arch="sm90a", allow_tf32=True)
KINDS = {"linear", "addmm", "layer_norm", "sdpa", "conv2d", "group_norm"}


class FiveKinds(nn.Module):
    """linear + bias + gelu + residual, layer_norm, SDPA (BMHK view in, transpose
    back out: out_layout "bmhk"), SDPA read as (B, H, L, E) ("strided"), conv2d +
    bias, group_norm + SiLU; glue ops between them."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)
        self.ln = nn.LayerNorm(64)
        self.out = nn.Linear(64, 32)
        self.conv = nn.Conv2d(16, 16, 3, padding=1)
        self.gn = nn.GroupNorm(4, 16)

    def forward(self, x, img):
        b = x.shape[0]
        h = self.ln(F.gelu(self.lin(x)) + x)
        q = (h * 0.5).view(b, 16, 4, 16).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q.sin(), q.cos()).transpose(1, 2).reshape(b, 16, 64)
        s = F.scaled_dot_product_attention(q.cos(), q, q).amax(dim=1)       # (b, 16, 16)
        y = torch.tanh(self.out(a)) * 2 + s.sum(-1, keepdim=True)
        z = F.silu(self.gn(self.conv(img.cos()))) + 1
        return y, z


class HFAttention(nn.Module):
    """Hugging Face's whisper attention: q scaled before the head split, each head
    split made contiguous, SDPA with scale 1.0, the head merge made contiguous."""

    def __init__(self, d=64, heads=4, scale_op="mul", sdpa_scale=1.0):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.scale_op, self.sdpa_scale = scale_op, sdpa_scale

    def split(self, t):
        b, n, _ = t.shape
        return t.view(b, n, self.h, self.dh).transpose(1, 2).contiguous()

    def forward(self, x):
        b, n, d = x.shape
        q = self.q(x) * 0.125 if self.scale_op == "mul" else self.q(x) / 3.0
        kw = {} if self.sdpa_scale is None else {"scale": self.sdpa_scale}
        a = F.scaled_dot_product_attention(self.split(q), self.split(self.k(x)), self.split(self.v(x)), **kw)
        return self.o(a.transpose(1, 2).contiguous().reshape(b, n, d))


def five_kinds_inputs(batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 16, 64, generator=g), torch.randn(batch, 16, 8, 8, generator=g))


def offloaded(model=None, inputs=None, dynamic_batch=False, options=OPTIONS) -> CompiledModel:
    """The CompiledModel of ``model`` (default FiveKinds) without a library."""
    torch.manual_seed(0)
    model = (model or FiveKinds()).eval()
    inputs = inputs if inputs is not None else five_kinds_inputs()
    cap = capture(model, inputs, dynamic_batch=dynamic_batch)
    plan = select(partition(cap.graph_module, options), options.arch, options)
    return CompiledModel(offload(cap.graph_module, plan, None), plan, None, None)


def kernel_like(module, out):
    """``out`` (the fallback's result) as the kernel path returns it."""
    return torch.empty_strided(out.shape, module.output_strides(tuple(out.shape)),
                               dtype=out.dtype).copy_(out)


def regions_on_cpu(monkeypatch) -> list:
    """Make every RegionModule run its fallback on CPU (kernel_like); returns the
    list that records the name of each region called."""
    calls = []

    def forward(self, *xs):
        calls.append(self.region.name)
        return kernel_like(self, self.fallback(*xs))
    monkeypatch.setattr(RegionModule, "forward", forward)
    return calls


def assert_close(out, ref, tol=1e-5):
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r, rtol=tol, atol=tol)
