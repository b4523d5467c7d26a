"""Norm modules the norm tests and benchmarks/norm_latency.py share, written the way
their libraries write them (the partitioner must recognise these forms)."""
import torch
from torch import nn


class LlamaRMSNorm(nn.Module):
    """transformers' LlamaRMSNorm, as written there."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GemmaRMSNorm(nn.Module):
    """transformers' Gemma(2/3)RMSNorm, as written there: a zero-centred weight, the
    scale (1 + weight) applied in float32 before the cast back."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


class LayerNorm1P(nn.LayerNorm):
    """transformers' NemotronLayerNorm1P (Megatron's LayerNorm1P): layer_norm with
    weight + 1 (autocast and its dtype handling left out)."""

    def forward(self, x):
        return nn.functional.layer_norm(x, self.normalized_shape, self.weight + 1, self.bias, self.eps)


class CohereLayerNorm(nn.Module):
    """transformers' CohereLayerNorm, as written there: a layer norm written out in
    float32, weight and no bias."""

    def __init__(self, hidden_size, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        mean = hidden_states.mean(-1, keepdim=True)
        variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
        hidden_states = (hidden_states - mean) * torch.rsqrt(variance + self.variance_epsilon)
        hidden_states = self.weight.to(torch.float32) * hidden_states
        return hidden_states.to(input_dtype)
