"""The default MODEL: a small ResNet-style CNN with BatchNorm (input `image`, 3x64x64, float32)."""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a residual connection."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNetCNN(nn.Module):
    """Stem + four basic blocks + global pooling + a 10-way classifier."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.blocks = nn.Sequential(BasicBlock(32, 32), BasicBlock(32, 64, 2), BasicBlock(64, 128, 2), BasicBlock(128, 128))
        self.fc = nn.Linear(128, num_classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(image))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def build() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The example model with seeded weights and randomized BatchNorm statistics (so BN folding is exercised)."""
    torch.manual_seed(0)
    model = ResNetCNN()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return model.eval(), (torch.randn(1, 3, 64, 64),)
