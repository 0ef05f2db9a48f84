"""Two models for benchmarks/precision.py beside the bundled examples (random weights, seeded):
an image model (a small ResNet) and a text encoder (a small BERT-like sentence encoder, mean-pooled)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """A ResNet basic block (two 3x3 convolutions, batch norm, a shortcut)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.short = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + self.short(x))


class SmallResNet(nn.Module):
    """ResNet-10-like on 3x112x112 images, 100 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 7, 2, 3, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2), Block(128, 256, 2))
        self.head = nn.Linear(256, 100)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(image)).mean(dim=(2, 3)))


def resnet():
    """The image model and one example batch."""
    torch.manual_seed(0)
    model = SmallResNet().eval()
    with torch.no_grad():  # non-trivial batch-norm statistics, as a trained model has
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model, (torch.randn(1, 3, 112, 112),)


class SentenceEncoder(nn.Module):
    """BERT-mini-like: 4 layers, d 256, 4 heads, GELU, mean pooling -> a 256-d sentence embedding."""

    def __init__(self, vocab: int = 8000, seq: int = 128, d: int = 256) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(1, seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, activation="gelu", batch_first=True, norm_first=False)
        self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids) + self.pos[:, : input_ids.shape[1]]
        return self.norm(self.encoder(x)).mean(dim=1)


def encoder():
    """The text encoder and one example batch of 128 tokens."""
    torch.manual_seed(0)
    return SentenceEncoder().eval(), (torch.randint(0, 8000, (1, 128), dtype=torch.int64),)
