"""The model the bad-input tests share (tests/unit/test_bad_input_mapping.py,
tests/gpu/test_bad_inputs.py)."""
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """A GEMM, a conv, a layer norm and a group norm: one region of each kind."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 32)
        self.conv = nn.Conv2d(16, 16, 3, padding=1)
        self.ln = nn.LayerNorm(32)
        self.gn = nn.GroupNorm(4, 16)

    def forward(self, x, img):
        return self.ln(torch.relu(self.lin(x))), F.silu(self.gn(self.conv(img)))
