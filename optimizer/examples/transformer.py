"""A small transformer encoder: int64 token ids with a dynamic sequence length (1-128), one float output.

Export it with `--input input_ids:int64:1-128 --value-range input_ids:0:999`.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 1000
MAX_SEQ = 128


class TinyEncoder(nn.Module):
    """Token + learned position embeddings, two encoder layers, mean pooling, a 2-way head."""

    def __init__(self, d_model: int = 128, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Parameter(torch.randn(1, MAX_SEQ, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=256, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 2)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids) + self.pos[:, : input_ids.shape[1]]
        return self.head(self.encoder(x).mean(dim=1))


def build() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The example encoder with seeded weights and one example batch of 16 tokens."""
    torch.manual_seed(0)
    model = TinyEncoder().eval()
    return model, (torch.randint(0, VOCAB, (1, 16), dtype=torch.int64),)
