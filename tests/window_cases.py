"""Swin-style window attention for the tests (partition/window_bias.py): the module
and its inputs."""
import torch
import torch.nn as nn


class WindowAttention(nn.Module):
    """microsoft/Swin-Transformer's WindowAttention (models/swin_transformer.py), with
    its split view given as ``split`` ("explicit": B_ // nW, or "infer": -1) and the
    relative position bias optional."""

    def __init__(self, dim=64, ws=4, heads=2, rel_bias=True, split="explicit"):
        super().__init__()
        self.ws, self.heads, self.rel_bias, self.split = ws, heads, rel_bias, split
        self.scale = (dim // heads) ** -0.5
        self.table = nn.Parameter(torch.randn((2 * ws - 1) ** 2, heads))
        coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + ws - 1
        self.register_buffer("index", rel[..., 0] * (2 * ws - 1) + rel[..., 1])
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, mask):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        if self.rel_bias:
            bias = self.table[self.index.view(-1)].view(N, N, -1).permute(2, 0, 1).contiguous()
            attn = attn + bias.unsqueeze(0)
        nW = mask.shape[0]
        lead = B_ // nW if self.split == "explicit" else -1
        attn = attn.view(lead, nW, self.heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, self.heads, N, N).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B_, N, C))


def inputs(n_windows=4, batch=2, n=16, dim=64, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch * n_windows, n, dim, generator=g).to(dtype)
    mask = torch.zeros(n_windows, n, n)
    mask[1:, : n // 2, n // 2:] = -100.0            # the shifted windows' cross-region mask
    mask[1:, n // 2:, : n // 2] = -100.0
    return x, mask.to(dtype)
