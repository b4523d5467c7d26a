"""Model blocks shared by the unit and GPU tests of in-place ops."""
import torch.nn as nn


class BasicBlock(nn.Module):
    """torchvision's BasicBlock forward: conv + BN + ``ReLU(inplace=True)``, conv + BN,
    ``out += identity``, ReLU in place (what torch.export keeps as relu_ / add_)."""

    def __init__(self, c=16):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        for bn in (self.bn1, self.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return self.relu(out)
