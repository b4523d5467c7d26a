"""Hand-written attention forms of real models, shared by the unit tests of their
partition and the GPU tests of their kernels (tests/unit/test_head_views.py,
test_softcap_attention.py; tests/gpu/test_head_views_gpu.py,
test_softcap_attention_gpu.py)."""
import math

import torch

BLOOM_SHAPE = (2, 4, 64, 32)            # B, heads, L, head dim
GEMMA2_SHAPE = (2, 4, 128, 64)
CAP, SCALING = 50.0, 256 ** -0.5        # Gemma 2: attn_logit_softcapping, query_pre_attn_scalar 256


def bloom_attention(qkv, alibi, mask=None, fp32_softmax=True):
    """BLOOM's attention (transformers BloomAttention, eager): q, k, v split from the
    fused projection (B, L, NH, 3, D) and copied to (B * NH, L, D), scores by baddbmm
    with the ALiBi bias (B * NH, 1, L), viewed to (B, NH, L, L) for the causal mask."""
    B, NH, L, D = BLOOM_SHAPE
    q, k, v = (qkv[..., i, :].transpose(1, 2).reshape(B * NH, L, D) for i in range(3))
    s = torch.baddbmm(alibi, q, k.transpose(-1, -2), beta=1.0, alpha=1 / math.sqrt(D))
    s = s.view(B, NH, L, L)
    if mask is None:            # built in the graph: a compile-time causal pattern
        causal = torch.ones(L, L, dtype=torch.bool, device=qkv.device).tril()
        mask = torch.zeros(L, L, dtype=s.dtype, device=qkv.device).masked_fill(
            ~causal, torch.finfo(s.dtype).min)[None, None]
    s = s + mask
    p = torch.softmax(s, -1, dtype=torch.float32).to(qkv.dtype) if fp32_softmax else s.softmax(-1)
    o = torch.bmm(p.view(B * NH, L, L), v)
    return o.view(B, NH, L, D).permute(0, 2, 1, 3).reshape(B, L, NH * D)


def deberta_like_attention(x, heads=4):
    """Attention on (B * heads, L, D) bmms of one input whose scores are viewed
    ``(-1, heads, L, L)`` (DeBERTa-v2's DisentangledSelfAttention): under a dynamic
    batch the -1 is symbolic."""
    q, k, v = x, x + 1, x * 2
    L = x.shape[-2]
    s = torch.bmm(q, k.transpose(1, 2)).view(-1, heads, L, L) * 0.125
    p = torch.softmax(s, -1, dtype=torch.float32).to(q.dtype)
    return torch.bmm(p.view(-1, L, L), v)


def cosine_attention(q, k, v, logit_scale, bias):
    """Swin-V2's cosine attention (torchvision ShiftedWindowAttentionV2): normalized q
    and k, a learned scale per head (logit_scale (H, 1, 1)), a position bias (1, H, L, L)."""
    attn = torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(k, dim=-1).transpose(-2, -1)
    attn = attn * torch.clamp(logit_scale, max=math.log(100.0)).exp()
    return (attn + bias).softmax(-1) @ v


def gemma2_attention(q, k, v, causal=True, shift=0.0, bias=None):
    """transformers' Gemma2 eager_attention_forward: the logits scaled, soft-capped
    (``CAP * tanh(s / CAP)``), then masked; q, k, v (B, NH, L, D)."""
    L = q.shape[-2]
    w = torch.matmul(q, k.transpose(2, 3)) * SCALING
    if bias is not None:
        w = w + bias
    if shift:
        w = w + shift
    w = torch.tanh(w / CAP) * CAP
    if causal:
        keep = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        w = w + torch.zeros(L, L, dtype=w.dtype, device=q.device).masked_fill(
            ~keep, torch.finfo(w.dtype).min)
    p = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)


def repeat_kv(x, n):
    """transformers' repeat_kv: (B, Hkv, S, D) -> (B, Hkv * n, S, D), each K/V head n
    times in a row (a copy)."""
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)
