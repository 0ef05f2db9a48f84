"""Models and traffic for benchmarks/traffic.py: a BERT-style encoder from a small transformers config (random weights,
seeded), and text traffic whose lengths are lognormal, as real sentences are (mostly short, a long tail)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

BERT_VOCAB = 30522
MAX_LENGTH = 128


def has_transformers() -> bool:
    """Whether the BERT-style encoder can be built here (transformers installed); its benchmarks skip it with the reason otherwise."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def bert():
    """BertModel with 4 layers, hidden 256 (4 heads, intermediate 1024), random weights: forward(input_ids, attention_mask)."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=BERT_VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                        max_position_embeddings=512)
    model = BertModel(config, add_pooling_layer=True).eval()
    ids = torch.randint(0, BERT_VOCAB, (1, 16), dtype=torch.int64)
    return model, (ids, torch.ones_like(ids))


def lengths(count: int, seed: int, median: float = 24.0, sigma: float = 0.9, high: int = MAX_LENGTH) -> list[int]:
    """`count` lognormal lengths with this median, within 1..high."""
    rng = np.random.default_rng(seed)
    return [int(min(high, max(1, round(x)))) for x in rng.lognormal(np.log(median), sigma, size=count)]


def write_traffic(path: Path, count: int, seed: int, vocab: int, mask: bool) -> Path:
    """perf_analyzer --input-data JSON: `count` requests of lognormal lengths, random token ids (and a mask of ones)."""
    rng = np.random.default_rng(seed + 1000)
    data = []
    for n in lengths(count, seed):
        entry = {"input_ids": {"content": rng.integers(0, vocab, n).tolist(), "shape": [n]}}
        if mask:
            entry["attention_mask"] = {"content": [1] * n, "shape": [n]}
        data.append(entry)
    path.write_text(json.dumps({"data": data}))
    return path
